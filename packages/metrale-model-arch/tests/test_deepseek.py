"""Parity of ``deepseek_v2`` and ``deepseek_v3`` with transformers on tiny random checkpoints
(every parameter and the routing correction bias randomized, float32): MLA over the paged
latent cache, interleaved or half-split RoPE, YaRN with DeepSeek's mscale, V2's greedy and
group-limited softmax routing, V3's sigmoid routing; and the published DeepSeek-V3 plan."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing import paged_greedy, transformers_greedy
from safetensors.torch import load_file, save_file

from metrale_config import ModelConfig, model_config_from_hf_dict, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.cache_spec import MlaLatentSpec
from metrale_model_arch.counts.deepseek import deepseek_param_counts
from metrale_model_arch.families.compiled_steps import can_compile
from metrale_model_arch.families.deepseek import DeepseekForCausalLM
from metrale_model_arch.families.deepseek.moe import DeepseekV2MoeBlock
from metrale_model_arch.families.deepseek.yarn import (
    mla_softmax_scale,
    yarn_attention_factor,
    yarn_inv_freq,
)
from metrale_model_arch.families.glm5_next.mlp import GlmMoeBlock
from metrale_model_arch.families.native_steps import native_executor
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.registry import cache_specs, family_for

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
BLOCK_SIZE = 4
NUM_GREEDY_TOKENS = 32
PROMPT_LENS = (1, 7, 13, 26)
# Logits within this of transformers' (float32); measured at most ~7e-6.
LOGITS_ATOL = 1e-4
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def yarn(mscale: float, mscale_all_dim: float) -> dict[str, Any]:
    return {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
    }


# name -> (model type, config kwargs)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # V2-Lite's shape: q_proj (no q_lora_rank), greedy routing (its n_group ignored), two
    # shared experts, the first layer dense.
    "v2-lite-greedy": (
        "deepseek_v2",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": None,
            "topk_method": "greedy",
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 2,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
        },
    ),
    # V2's shape: the low-rank query, group-limited routing, scaled weights, attention
    # biases, YaRN with V2's mscale = mscale_all_dim (the softmax scale grows, cos/sin not).
    "v2-lora-group-limited-yarn": (
        "deepseek_v2",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": 24,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "routed_scaling_factor": 2.0,
            "first_k_dense_replace": 0,
            "attention_bias": True,
            "rope_parameters": yarn(0.707, 0.707),
        },
    ),
    # V3's shape: sigmoid routing with the correction bias, 4 groups of which 2 kept,
    # renormalized and scaled; YaRN with mscale != mscale_all_dim (cos/sin scaled too).
    "v3-noaux-yarn": (
        "deepseek_v3",
        {
            "num_hidden_layers": 3,
            "q_lora_rank": 24,
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1,
            "rope_parameters": yarn(1.0, 0.8),
        },
    ),
    # V3 with half-split RoPE (rope_interleave false), plain RoPE, no q_lora_rank, every layer
    # sparse, ungrouped, a tied head.
    "v3-half-split-tied": (
        "deepseek_v3",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": None,
            "rope_interleave": False,
            "n_group": 1,
            "topk_group": 1,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.5,
            "first_k_dense_replace": 0,
            "rope_theta": 500.0,
            "tie_word_embeddings": True,
        },
    ),
}
HF_CLASSES = {
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}


@attrs.frozen(kw_only=True)
class Checkpoint:
    name: str
    path: Path
    config: ModelConfig
    hf_model: Any
    prompts: dict[int, list[int]]


def save_tiny_deepseek(path: Path, model_type: str, seed: int = 0, **kwargs: Any) -> Any:
    config_class, model_class = HF_CLASSES[model_type]
    hf_config = getattr(transformers, config_class)(**kwargs)
    hf_model = getattr(transformers, model_class)(hf_config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*hf_model.named_parameters(), *hf_model.named_buffers()]:
            if "rotary_emb" in name:
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            tensor.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Checkpoint:
    path = tmp_path_factory.mktemp(request.param)
    model_type, kwargs = CASES[request.param]
    hf_model = save_tiny_deepseek(path, model_type, **SMALL, **kwargs)
    generator = torch.Generator().manual_seed(1)
    prompts = {
        seq_id: torch.randint(VOCAB_SIZE, (length,), generator=generator).tolist()
        for seq_id, length in enumerate(PROMPT_LENS)
    }
    return Checkpoint(
        name=request.param,
        path=path,
        config=model_config_from_hf_file(path),
        hf_model=hf_model,
        prompts=prompts,
    )


def load(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32) -> DeepseekForCausalLM:
    options = LoadOptions(dtype=dtype, device="cpu")
    model = load_safetensors_model(checkpoint.path, checkpoint.config, options)
    assert isinstance(model, DeepseekForCausalLM)
    return model


def hf_logits(checkpoint: Checkpoint, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return checkpoint.hf_model(torch.tensor([prompt])).logits[0]


def test_config_exercises_the_case(checkpoint: Checkpoint) -> None:
    config = checkpoint.config
    model_type, kwargs = CASES[checkpoint.name]
    assert config.model_type == model_type
    assert family_for(config) is DeepseekForCausalLM
    assert config.mla is not None
    assert config.moe is not None
    assert config.mla.q_lora_rank == kwargs["q_lora_rank"]
    assert config.mla.rope_interleave == kwargs.get("rope_interleave", True)
    assert config.head_dim == SMALL["qk_nope_head_dim"] + SMALL["qk_rope_head_dim"]
    first_dense = kwargs["first_k_dense_replace"]
    assert config.moe.mlp_layer_types == tuple(
        "sparse" if i >= first_dense else "dense" for i in range(kwargs["num_hidden_layers"])
    )
    is_greedy = kwargs.get("topk_method") == "greedy"
    assert config.moe.n_group == (1 if is_greedy else kwargs["n_group"])
    assert config.moe.topk_group == (1 if is_greedy else kwargs["topk_group"])
    assert config.o_proj_bias == kwargs.get("attention_bias", False)
    rope = kwargs.get("rope_parameters")
    if rope is None:
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling is not None
        assert config.rope_scaling.mscale == rope["mscale"]
        assert config.rope_scaling.mscale_all_dim == rope["mscale_all_dim"]
    # Every layer caches the latent and the RoPE key: 32 + 8 values a token.
    specs = cache_specs(config, indexer_paged=True)
    assert specs == (MlaLatentSpec(kv_lora_rank=32, qk_rope_head_dim=8),) * len(specs)
    model = load(checkpoint)
    sparse_block = DeepseekV2MoeBlock if model_type == "deepseek_v2" else GlmMoeBlock
    mlps = [type(layer.mlp) for layer in model.model.layers]
    assert mlps[first_dense:] == [sparse_block] * (len(mlps) - first_dense)


def test_parameter_counts_equal_transformers(checkpoint: Checkpoint) -> None:
    counts = deepseek_param_counts(checkpoint.config)
    hf_params = sum(p.numel() for p in checkpoint.hf_model.parameters())
    hf_buffers = sum(b.numel() for n, b in checkpoint.hf_model.named_buffers() if "rotary" not in n)
    ours = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert ours + counts.layers_fp32 == hf_params + hf_buffers
    model = load(checkpoint)
    assert sum(p.numel() for p in model.parameters()) == ours + counts.layers_fp32
    # The router and the correction bias stay float32 at any serve dtype, as counted.
    bf16 = load(checkpoint, torch.bfloat16)
    kept = sum(p.numel() for p in bf16.parameters() if p.dtype == torch.float32)
    assert kept == counts.layers_fp32
    assert weight_bytes(checkpoint.config, 2).total() == 2 * ours + 4 * counts.layers_fp32


def test_yarn_table_and_softmax_scale_equal_transformers(checkpoint: Checkpoint) -> None:
    scaling = checkpoint.config.rope_scaling
    attention = checkpoint.hf_model.model.layers[0].self_attn
    assert mla_softmax_scale(checkpoint.config) == pytest.approx(attention.scaling, rel=1e-12)
    if scaling is None:
        return
    rotary = checkpoint.hf_model.model.rotary_emb
    inv_freq = yarn_inv_freq(SMALL["qk_rope_head_dim"], checkpoint.config.rope_theta, scaling)
    torch.testing.assert_close(inv_freq, rotary.inv_freq, atol=0, rtol=0)
    assert yarn_attention_factor(scaling) == pytest.approx(rotary.attention_scaling, rel=1e-12)


def test_ragged_prefill_matches_transformers(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    runner = paged_runner(load(checkpoint), num_blocks=64, block_size=BLOCK_SIZE)
    logits = runner.step(checkpoint.prompts)
    for seq_id, prompt in checkpoint.prompts.items():
        expected = hf_logits(checkpoint, prompt)
        assert logits[seq_id].shape == (len(prompt), VOCAB_SIZE)
        torch.testing.assert_close(logits[seq_id], expected, atol=LOGITS_ATOL, rtol=0)


def greedy(
    model: DeepseekForCausalLM,
    prompts: dict[int, list[int]],
    paged_runner: Callable[..., Any],
    seed: int,
) -> dict[int, list[int]]:
    runner = paged_runner(model, num_blocks=128, block_size=BLOCK_SIZE, seed=seed)
    return paged_greedy(runner, prompts, NUM_GREEDY_TOKENS)


def test_batched_greedy_decode_matches_transformers_generate_and_alone(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    expected = {
        seq_id: transformers_greedy(checkpoint.hf_model, prompt, NUM_GREEDY_TOKENS)
        for seq_id, prompt in checkpoint.prompts.items()
    }
    model = load(checkpoint)
    assert greedy(model, checkpoint.prompts, paged_runner, seed=3) == expected
    alone = greedy(model, {3: checkpoint.prompts[3]}, paged_runner, seed=7)
    assert alone[3] == expected[3]


def test_chunked_prefill_matches_one_shot(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    model = load(checkpoint)
    prompt, other = checkpoint.prompts[3], checkpoint.prompts[2]
    first_cut, second_cut = 9, 19
    one_shot = paged_runner(model, num_blocks=32, block_size=BLOCK_SIZE).step({0: prompt})[0]
    chunked = paged_runner(model, num_blocks=32, block_size=BLOCK_SIZE, seed=5)
    first = chunked.step({0: prompt[:first_cut]})[0]
    # The second chunk shares its step with another sequence's whole prefill.
    second = chunked.step({1: other, 0: prompt[first_cut:second_cut]})
    third = chunked.step({0: prompt[second_cut:]})[0]
    torch.testing.assert_close(torch.cat([first, second[0], third]), one_shot, atol=1e-4, rtol=0)
    torch.testing.assert_close(second[1], hf_logits(checkpoint, other), atol=1e-4, rtol=0)


def test_bfloat16_model_is_as_close_to_float32_as_transformers_bfloat16(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    prompt = checkpoint.prompts[3]
    model = load(checkpoint, torch.bfloat16)
    ours = paged_runner(model, num_blocks=16, block_size=BLOCK_SIZE).step({0: prompt})[0]
    assert ours.dtype == torch.bfloat16
    with torch.inference_mode():
        hf_bf16 = copy.deepcopy(checkpoint.hf_model).to(torch.bfloat16)
        theirs = hf_bf16(torch.tensor([prompt])).logits[0]
    exact = hf_logits(checkpoint, prompt)
    our_error = (ours.float() - exact).abs().mean()
    their_error = (theirs.float() - exact).abs().mean()
    assert our_error <= 1.25 * their_error + 1e-3, (our_error, their_error)


def test_no_fused_llama_executor_takes_it(checkpoint: Checkpoint) -> None:
    model = load(checkpoint)
    assert not can_compile(model)
    assert native_executor(model) is None
    assert model.executor_name == "eager"


def test_mtp_layers_in_the_checkpoint_are_skipped(tmp_path: Path) -> None:
    model_type, kwargs = CASES["v3-noaux-yarn"]
    save_tiny_deepseek(tmp_path, model_type, **SMALL, **kwargs)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    num_layers = kwargs["num_hidden_layers"]
    last, mtp = f"model.layers.{num_layers - 1}.", f"model.layers.{num_layers}."
    tensors.update(
        {mtp + name[len(last) :]: t.clone() for name, t in tensors.items() if name.startswith(last)}
    )
    tensors[mtp + "eh_proj.weight"] = torch.zeros(SMALL["hidden_size"], 2 * SMALL["hidden_size"])
    save_file(tensors, file, metadata={"format": "pt"})
    config = model_config_from_hf_file(tmp_path)
    assert config.mtp is not None
    model = load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))
    assert len(model.model.layers) == num_layers


def test_v2_norm_topk_prob_is_refused() -> None:
    # transformers' DeepseekV2 ignores it; no published V2 config sets it.
    _, kwargs = CASES["v2-lite-greedy"]
    hf_config = transformers.DeepseekV2Config(**SMALL, **kwargs, norm_topk_prob=True)
    config = model_config_from_hf_dict(hf_config.to_dict(), source="DeepseekV2Config")
    with pytest.raises(ValueError, match="deepseek_v2 with norm_topk_prob is not supported"):
        DeepseekForCausalLM(config)


DEEPSEEK_V3_DIR = Path(__file__).parent / "data" / "deepseek-v3"


def test_the_published_deepseek_v3_plan_equals_transformers() -> None:
    config = model_config_from_hf_file(DEEPSEEK_V3_DIR)
    assert config.mla is not None
    assert config.moe is not None
    assert (config.moe.n_group, config.moe.topk_group) == (8, 4)
    assert config.moe.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 58
    counts = deepseek_param_counts(config)
    stack = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    # transformers' DeepseekV3ForCausalLM on this config (meta device): 671,026,404,352
    # parameters and 14,848 correction-bias entries (58 sparse layers x 256 experts).
    assert stack + counts.layers_fp32 == 671_026_419_200
    assert counts.layers_fp32 == 58 * 256 * (7168 + 1)
    assert counts.mtp == 0
    # 61 layers x (512 latent + 64 RoPE key), one row per token for all 128 heads.
    specs = cache_specs(config, indexer_paged=True)
    assert specs == (MlaLatentSpec(kv_lora_rank=512, qk_rope_head_dim=64),) * 61
    # YaRN factor 40, mscale_all_dim 1: softmax scale 192 ** -0.5 * (0.1 ln 40 + 1) ** 2.
    assert mla_softmax_scale(config) == pytest.approx(192**-0.5 * 1.3688879454113936**2)
