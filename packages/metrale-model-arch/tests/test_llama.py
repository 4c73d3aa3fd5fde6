"""Parity of the llama family (llama, mistral, qwen2, qwen3) with HF transformers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing import paged_greedy, transformers_greedy
from metrale_testing.device_scan import assert_tensors_made_on_the_models_device
from metrale_testing.padded_step import assert_padding_rows_change_nothing

from metrale_config import ModelConfig, RopeScaling, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families import LlamaForCausalLM
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 1000
BLOCK_SIZE = 4
NUM_GREEDY_TOKENS = 32
PROMPT_LENS = (1, 5, 11, 17, 26)
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
    # Wider than HF's default 0.02, so greedy decoding is not one token repeated.
    "initializer_range": 0.2,
    # No eos: HF generate must not stop early, and nothing may bias the greedy choice.
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}

# name → (HF config class, HF model class, config kwargs)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-gqa-llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "llama-tied-mha": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_hidden_layers": 2, "num_key_value_heads": 4, "tie_word_embeddings": True},
    ),
    "qwen2-bias-tied-linear-rope-sliding": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
            "use_sliding_window": True,
            "sliding_window": 7,
            "max_window_layers": 1,
        },
    ),
    "qwen3-qk-norm-head-dim": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 32},
    ),
    "mistral-sliding-window": (
        "MistralConfig",
        "MistralForCausalLM",
        {"num_hidden_layers": 2, "num_key_value_heads": 2, "sliding_window": 8},
    ),
}


@attrs.frozen(kw_only=True)
class Checkpoint:
    path: Path
    config: ModelConfig
    hf_model: Any
    prompts: dict[int, list[int]]


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Checkpoint:
    config_class, model_class, kwargs = CASES[request.param]
    torch.manual_seed(0)
    hf_config = getattr(transformers, config_class)(**SMALL, **kwargs)
    hf_model = getattr(transformers, model_class)(hf_config).eval()
    path = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(path, safe_serialization=True)
    generator = torch.Generator().manual_seed(1)
    prompts = {
        seq_id: torch.randint(VOCAB_SIZE, (length,), generator=generator).tolist()
        for seq_id, length in enumerate(PROMPT_LENS)
    }
    return Checkpoint(
        path=path, config=model_config_from_hf_file(path), hf_model=hf_model, prompts=prompts
    )


def load(
    checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, kernel_backend: str = "auto"
) -> LlamaForCausalLM:
    options = LoadOptions(dtype=dtype, device="cpu", kernel_backend=kernel_backend)
    model = load_safetensors_model(checkpoint.path, checkpoint.config, options)
    assert isinstance(model, LlamaForCausalLM)
    return model


def hf_logits(checkpoint: Checkpoint, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return checkpoint.hf_model(torch.tensor([prompt])).logits[0]


def test_config_exercises_the_case(checkpoint: Checkpoint) -> None:
    config, path = checkpoint.config, checkpoint.path.name
    assert config.num_key_value_heads < config.num_attention_heads or "mha" in path
    assert config.tie_word_embeddings == ("tied" in path)
    assert config.qkv_bias == ("bias" in path)
    assert config.qk_norm == ("qk-norm" in path)
    assert (config.sliding_window is not None) == ("sliding" in path)
    rope_type = config.rope_scaling.rope_type if config.rope_scaling else "default"
    assert (rope_type != "default") == ("rope" in path)
    if config.sliding_window is not None:
        assert config.sliding_window < max(PROMPT_LENS)


def test_ragged_prefill_matches_transformers(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    runner = paged_runner(load(checkpoint), num_blocks=64, block_size=BLOCK_SIZE)
    logits = runner.step(checkpoint.prompts)
    for seq_id, prompt in checkpoint.prompts.items():
        expected = hf_logits(checkpoint, prompt)
        assert logits[seq_id].shape == (len(prompt), VOCAB_SIZE)
        torch.testing.assert_close(logits[seq_id], expected, atol=1e-4, rtol=0)


def test_batched_greedy_decode_matches_transformers_generate(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    expected = {
        seq_id: transformers_greedy(checkpoint.hf_model, prompt, NUM_GREEDY_TOKENS)
        for seq_id, prompt in checkpoint.prompts.items()
    }

    runner = paged_runner(load(checkpoint), num_blocks=128, block_size=BLOCK_SIZE, seed=3)
    assert paged_greedy(runner, checkpoint.prompts, NUM_GREEDY_TOKENS) == expected
    tables = list(runner.block_tables.values())
    assert any(t != list(range(t[0], t[0] + len(t))) for t in tables), "blocks were contiguous"


def test_every_tensor_is_made_on_the_models_device(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """With the reference ops a GPU's torch backend runs."""
    model = load(checkpoint, kernel_backend="torch")
    assert_tensors_made_on_the_models_device(
        model, paged_runner, checkpoint.prompts, num_blocks=128, block_size=BLOCK_SIZE
    )


def test_a_step_padded_to_a_bucket_gives_the_same_logits(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """The property CUDA graphs' padded batches rely on (``metrale_testing.padded_step``)."""
    assert_padding_rows_change_nothing(
        load(checkpoint),
        paged_runner,
        checkpoint.prompts,
        bucket=8,
        num_blocks=128,
        block_size=BLOCK_SIZE,
    )


def test_chunked_prefill_matches_one_shot(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    model = load(checkpoint)
    prompt, other = checkpoint.prompts[4], checkpoint.prompts[3]
    one_shot = paged_runner(model, num_blocks=32, block_size=BLOCK_SIZE).step({0: prompt})[0]

    chunked = paged_runner(model, num_blocks=32, block_size=BLOCK_SIZE, seed=5)
    first = chunked.step({0: prompt[:9]})[0]
    # The second chunk shares its step with another sequence's whole prefill.
    second = chunked.step({1: other, 0: prompt[9:19]})
    third = chunked.step({0: prompt[19:]})[0]
    torch.testing.assert_close(torch.cat([first, second[0], third]), one_shot, atol=1e-4, rtol=0)
    torch.testing.assert_close(second[1], hf_logits(checkpoint, other), atol=1e-4, rtol=0)


def test_bfloat16_model_is_as_close_to_float32_as_transformers_bfloat16(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    prompt = checkpoint.prompts[4]
    model = load(checkpoint, torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ours = paged_runner(model, num_blocks=16, block_size=BLOCK_SIZE).step({0: prompt})[0]
    assert ours.dtype == torch.bfloat16
    with torch.inference_mode():
        hf_bf16 = copy.deepcopy(checkpoint.hf_model).to(torch.bfloat16)
        theirs = hf_bf16(torch.tensor([prompt])).logits[0]
    exact = hf_logits(checkpoint, prompt)
    our_error = (ours.float() - exact).abs().mean()
    their_error = (theirs.float() - exact).abs().mean()
    assert our_error <= 1.25 * their_error + 1e-3, (our_error, their_error)


def test_rope_table_is_sized_by_max_seq_len(tiny_config: ModelConfig) -> None:
    assert LlamaForCausalLM(tiny_config).model.cos_sin_cache.shape == (64, tiny_config.head_dim)
    table = LlamaForCausalLM(tiny_config, max_seq_len=200).model.cos_sin_cache
    assert table.shape == (200, tiny_config.head_dim)
    assert table.dtype == torch.float32


def test_dynamic_rope_is_unscaled_within_the_original_window(tiny_config: ModelConfig) -> None:
    dynamic = attrs.evolve(tiny_config, rope_scaling=RopeScaling(rope_type="dynamic", factor=4.0))
    plain = LlamaForCausalLM(tiny_config).model.cos_sin_cache
    torch.testing.assert_close(LlamaForCausalLM(dynamic).model.cos_sin_cache, plain)
    longer = LlamaForCausalLM(dynamic, max_seq_len=128).model.cos_sin_cache
    assert not torch.allclose(longer[:64], plain)


def test_unsupported_rope_type_is_named(tiny_config: ModelConfig) -> None:
    yarn = attrs.evolve(tiny_config, rope_scaling=RopeScaling(rope_type="yarn", factor=4.0))
    with pytest.raises(ValueError, match=r"unsupported rope_type 'yarn'.*llama3"):
        LlamaForCausalLM(yarn)


def test_unsupported_hidden_act_is_named(tiny_config: ModelConfig) -> None:
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu'"):
        LlamaForCausalLM(attrs.evolve(tiny_config, hidden_act="gelu"))


def test_parameter_names_are_hf_names_with_fused_projections(tiny_config: ModelConfig) -> None:
    names = set(LlamaForCausalLM(tiny_config).state_dict())
    assert {
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.qkv_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
    } <= names
    assert not any("cos_sin" in name for name in names)


def test_build_model_shares_tied_embeddings(tiny_config: ModelConfig) -> None:
    tied = attrs.evolve(tiny_config, tie_word_embeddings=True)
    weights = LlamaForCausalLM(tied).state_dict()
    model = build_model(tied, weights.items(), LoadOptions(dtype=torch.float32, device="cpu"))
    assert isinstance(model, LlamaForCausalLM)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
