"""Weight plans equal, owner by owner, the parameters transformers builds from the same config."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch

from metrale_config import ModelConfig, model_config_from_hf_dict
from metrale_model_arch.memory.weights import (
    EMBEDDINGS,
    LAYERS,
    LM_HEAD,
    VISION,
    WEIGHT_OWNERS,
    param_counts,
    weight_bytes,
    weight_owner,
)

transformers = pytest.importorskip("transformers")

BF16_BYTES = 2
SMALL = {
    "vocab_size": 101,
    "hidden_size": 48,
    "intermediate_size": 40,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}

# name → (HF config class, HF causal LM class, config kwargs on top of SMALL)
LLAMA_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-untied": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-tied-biases-head-dim": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "head_dim": 20},
    ),
    "mistral-head-dim": ("MistralConfig", "MistralForCausalLM", {"head_dim": 16}),
    "mistral-tied-mha": (
        "MistralConfig",
        "MistralForCausalLM",
        {"tie_word_embeddings": True, "num_key_value_heads": 4},
    ),
    "qwen2-untied": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3-head-dim": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    "qwen3-tied-bias": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"tie_word_embeddings": True, "attention_bias": True, "head_dim": 12},
    ),
}

QWEN3_MOE = {"num_experts": 5, "num_experts_per_tok": 2, "moe_intermediate_size": 24}
MOE_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3-moe-all-sparse": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3_MOE),
    "qwen3-moe-dense-layers": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        # Layers 0 and 2 dense by the step, layer 3 by mlp_only_layers: only layer 1 is sparse.
        {**QWEN3_MOE, "num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    ),
    "qwen3-moe-tied-bias-head-dim": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {**QWEN3_MOE, "tie_word_embeddings": True, "attention_bias": True, "head_dim": 16},
    ),
    "mixtral-untied": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 3, "num_experts_per_tok": 2},
    ),
    "mixtral-tied-head-dim": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "tie_word_embeddings": True, "head_dim": 8},
    ),
}

# Six layers mixing every kind: DSA with its own / a shared indexer, KDA, dense and MoE.
SMALL_GLM5_NEXT = {
    "vocab_size": 101,
    "pad_token_id": 0,
    "hidden_size": 64,
    "intermediate_size": 56,
    "moe_intermediate_size": 12,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 5,
    "n_shared_experts": 2,
    "num_experts_per_tok": 2,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 12,
    "v_head_dim": 10,
    "index_n_heads": 3,
    "index_head_dim": 8,
    "index_topk": 8,
    "index_kpool": 4,
    "linear_num_heads": 3,
    "linear_head_dim": 6,
    "linear_conv_kernel_dim": 3,
    "hc_mult": 3,
    "layer_types": [
        "indexed_attention",
        "linear_attention",
        "indexed_attention",
        "full_attention",
        "linear_attention",
        "indexed_attention",
    ],
    "mlp_layer_types": ["sparse", "dense", "dense", "sparse", "sparse", "dense"],
    "indexer_types": ["full", "full", "shared", "full", "shared", "shared"],
}
SMALL_VISION = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32}
GLM5_NEXT_CASES = [
    pytest.param({}, False, id="default"),
    pytest.param(SMALL_GLM5_NEXT, False, id="small-untied"),
    pytest.param(
        {**SMALL_GLM5_NEXT, "attention_bias": True, "n_shared_experts": 0},
        True,
        id="small-tied-bias-no-shared-experts",
        # transformers builds the zero-width shared-expert MLP and torch warns initializing it.
        marks=pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning"),
    ),
]


@pytest.fixture
def bfloat16_default() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def hf_bytes_by_owner(named_parameters: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
    """Bytes per owner of parameters named as in a causal LM (``model.layers.0...``)."""
    totals = dict.fromkeys(WEIGHT_OWNERS, 0)
    for name, parameter in named_parameters:
        owner = weight_owner(name)
        totals[owner] = totals.get(owner, 0) + parameter.numel() * parameter.element_size()
    return totals


def checkpoint_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters (a tied head once) and persistent buffers: every tensor a checkpoint holds."""
    yield from model.named_parameters()
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                yield f"{module_name}.{name}", buffer


def plan_and_model(case: tuple[str, str, dict[str, Any]]) -> tuple[ModelConfig, torch.nn.Module]:
    config_class, model_class, kwargs = case
    hf_config = getattr(transformers, config_class)(**{**SMALL, **kwargs})
    with torch.device("meta"):
        model = getattr(transformers, model_class)(hf_config)
    config = model_config_from_hf_dict(hf_config.to_dict(), source=f"{config_class} {kwargs}")
    return config, model


@pytest.mark.usefixtures("bfloat16_default")
@pytest.mark.parametrize("name", sorted(LLAMA_CASES))
def test_llama_family_weight_bytes_equal_transformers(name: str) -> None:
    config, model = plan_and_model(LLAMA_CASES[name])
    # named_parameters yields a tied head once, under the embeddings.
    assert weight_bytes(config, BF16_BYTES).by_owner() == hf_bytes_by_owner(
        checkpoint_tensors(model)
    )


@pytest.mark.usefixtures("bfloat16_default")
@pytest.mark.parametrize("name", sorted(MOE_CASES))
def test_moe_weight_bytes_equal_transformers(name: str) -> None:
    config, model = plan_and_model(MOE_CASES[name])
    # named_parameters yields a tied head once, under the embeddings.
    assert weight_bytes(config, BF16_BYTES).by_owner() == hf_bytes_by_owner(
        checkpoint_tensors(model)
    )


def test_qwen3_moe_dense_layers_are_planned_dense() -> None:
    config, _ = plan_and_model(MOE_CASES["qwen3-moe-dense-layers"])
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("dense", "sparse", "dense", "dense")


@pytest.mark.usefixtures("bfloat16_default")
@pytest.mark.parametrize(("text_kwargs", "is_tied"), GLM5_NEXT_CASES)
def test_glm5_next_weight_bytes_equal_transformers(
    text_kwargs: dict[str, Any], is_tied: bool
) -> None:
    vision = SMALL_VISION if text_kwargs else None
    hf_config = transformers.Glm5NextConfig(
        text_config=text_kwargs, vision_config=vision, tie_word_embeddings=is_tied
    )
    with torch.device("meta"):
        model = transformers.Glm5NextForConditionalGeneration(hf_config)
    config = model_config_from_hf_dict(hf_config.to_dict(), source=f"glm5_next {text_kwargs}")

    # The vision tower (``model.visual.*``) is its own owner, ``weights.vision``.
    every_tensor = (
        (name.replace("model.language_model.", "model.", 1), parameter)
        for name, parameter in checkpoint_tensors(model)
    )
    expected = hf_bytes_by_owner(every_tensor)
    assert weight_bytes(config, BF16_BYTES).by_owner() == expected
    assert (expected[LM_HEAD] == 0) is is_tied
    assert expected[VISION] > 0


@pytest.mark.usefixtures("bfloat16_default")
def test_glm5_next_text_weight_bytes_equal_text_model_and_head() -> None:
    hf_config = transformers.Glm5NextTextConfig(**SMALL_GLM5_NEXT)
    with torch.device("meta"):
        text_model = transformers.Glm5NextTextModel(hf_config)
        head = torch.nn.Linear(hf_config.hidden_size, hf_config.vocab_size, bias=False)
    config = model_config_from_hf_dict(hf_config.to_dict(), source="glm5_next_text small")

    expected = hf_bytes_by_owner(("model." + n, p) for n, p in checkpoint_tensors(text_model))
    expected[LM_HEAD] = head.weight.numel() * head.weight.element_size()
    assert config.model_type == "glm5_next_text"
    assert weight_bytes(config, BF16_BYTES).by_owner() == expected


@pytest.mark.usefixtures("bfloat16_default")
def test_glm5_next_float32_parameters_are_the_layers_fp32() -> None:
    hf_config = transformers.Glm5NextTextConfig(**SMALL_GLM5_NEXT)
    with torch.device("meta"):
        text_model = transformers.Glm5NextTextModel(hf_config)
    config = model_config_from_hf_dict(hf_config.to_dict(), source="glm5_next_text small")

    fp32 = {n: p.numel() for n, p in checkpoint_tensors(text_model) if p.dtype == torch.float32}
    assert all(weight_owner("model." + name) == LAYERS for name in fp32)
    assert param_counts(config).layers_fp32 == sum(fp32.values())


def test_glm5_next_default_config_has_313b_parameters() -> None:
    # transformers' default GLM-5.3 text stack (45 layers, 288 experts) plus an untied head.
    config = model_config_from_hf_dict(
        transformers.Glm5NextConfig().to_dict(), source="Glm5NextConfig()"
    )
    counts = param_counts(config)
    total = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert total + counts.layers_fp32 == 313_326_828_862
    assert counts.layers_fp32 == 53_182_782
    assert weight_bytes(config, BF16_BYTES).by_owner()[EMBEDDINGS] == 154880 * 4096 * BF16_BYTES
