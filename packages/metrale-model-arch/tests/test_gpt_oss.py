"""Parity of ``gpt_oss`` with transformers on tiny random checkpoints (every parameter
randomized, float32): attention sinks, sliding-window layers shorter than the prompts, q/k/v/o
biases, YaRN, the biased router and experts with their clamped SwiGLU; and the published
gpt-oss-120b plan."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing.family_parity import (
    Bfloat16ParityChecks,
    FamilyCheckpoint,
    assert_counts_equal_transformers,
    hf_logits,
    load_checkpoint,
)
from safetensors.torch import load_file, save_file

from metrale_config import RopeScaling, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.cache_spec import FullAttentionSpec, SlidingWindowSpec
from metrale_model_arch.counts.gpt_oss import gpt_oss_param_counts
from metrale_model_arch.families.gpt_oss import GptOssForCausalLM
from metrale_model_arch.families.rotary import yarn_attention_factor, yarn_inv_freq
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.mxfp4_checkpoints import (
    E8M0_BIAS,
    dequantize_mxfp4,
    mxfp4_checkpoint_tensors,
)
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.registry import cache_specs, family_for

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
BLOCK_SIZE = 4
PROMPT_LENS = (1, 7, 13, 26)
# Logits within this of transformers' (float32); measured at most 6e-6.
LOGITS_ATOL = 1e-4
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 32,
    "head_dim": 16,
    "num_local_experts": 8,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
# name -> config kwargs
CASES: dict[str, dict[str, Any]] = {
    # gpt-oss's shape: sliding and full layers alternating (the window shorter than the
    # prompts), GQA, YaRN without truncation, a clamp the random activations reach.
    "alternating-yarn": {
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts_per_tok": 2,
        "sliding_window": 6,
        "swiglu_alpha": 1.3,
        "swiglu_limit": 1.5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
        },
    },
    # Declared layer types, plain RoPE, no attention biases, MHA, a tied head, top 3.
    "declared-layers-tied": {
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_experts_per_tok": 3,
        "sliding_window": 5,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        "attention_bias": False,
        "swiglu_alpha": 2.0,
        "swiglu_limit": 2.5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        "tie_word_embeddings": True,
    },
}


def save_tiny_gpt_oss(path: Path, seed: int = 0, **kwargs: Any) -> Any:
    hf_model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**kwargs)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in hf_model.named_parameters():
            noise = torch.randn(tensor.shape, generator=generator)
            scale = 1.0 if name.endswith("sinks") else 0.2
            tensor.copy_(1.0 + 0.2 * noise if "norm" in name else scale * noise)
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> FamilyCheckpoint:
    path = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_gpt_oss(path, **SMALL, **CASES[request.param])
    return FamilyCheckpoint.saved(request.param, path, hf_model, PROMPT_LENS)


class TestParity(Bfloat16ParityChecks):
    family = GptOssForCausalLM
    logits_atol = LOGITS_ATOL

    def bfloat16_prompts(self, checkpoint: FamilyCheckpoint) -> list[list[int]]:
        # Over several prompts: a router's choice flipped by bfloat16 on one token moves a
        # single prompt's error several-fold, either way (measured: 3.5x ours, 0.3x theirs).
        generator = torch.Generator().manual_seed(5)
        return [torch.randint(VOCAB_SIZE, (24,), generator=generator).tolist() for _ in range(8)]


def test_config_exercises_the_case(checkpoint: FamilyCheckpoint) -> None:
    config, kwargs = checkpoint.config, CASES[checkpoint.name]
    assert family_for(config) is GptOssForCausalLM
    assert config.layer_types == tuple(checkpoint.hf_model.config.layer_types)
    assert config.sliding_window is not None
    assert config.sliding_window < max(PROMPT_LENS)
    assert (config.swiglu_alpha, config.swiglu_limit) == (
        kwargs["swiglu_alpha"],
        kwargs["swiglu_limit"],
    )
    assert config.qkv_bias == config.o_proj_bias == kwargs.get("attention_bias", True)
    window, heads, dim = config.sliding_window, config.num_key_value_heads, config.head_dim
    assert cache_specs(config, indexer_paged=True) == tuple(
        SlidingWindowSpec(num_kv_heads=heads, head_dim=dim, sliding_window=window)
        if kind == "sliding_attention"
        else FullAttentionSpec(num_kv_heads=heads, head_dim=dim)
        for kind in config.layer_types
    )


def test_parameter_counts_equal_transformers(checkpoint: FamilyCheckpoint) -> None:
    assert_counts_equal_transformers(
        checkpoint, gpt_oss_param_counts(checkpoint.config), GptOssForCausalLM
    )


def test_rope_table_equals_transformers(checkpoint: FamilyCheckpoint) -> None:
    scaling = checkpoint.config.rope_scaling
    rotary = checkpoint.hf_model.model.rotary_emb
    if scaling is None:
        assert rotary.attention_scaling == 1.0
        return
    inv_freq = yarn_inv_freq(SMALL["head_dim"], checkpoint.config.rope_theta, scaling)
    torch.testing.assert_close(inv_freq, rotary.inv_freq, atol=0, rtol=0)
    assert yarn_attention_factor(scaling) == pytest.approx(rotary.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("mutant", ["no sinks", "no clamp", "no window"])
def test_each_part_is_exercised(
    checkpoint: FamilyCheckpoint, mutant: str, paged_runner: Callable[..., Any]
) -> None:
    model = load_checkpoint(checkpoint, GptOssForCausalLM)
    for layer in model.model.layers:
        if mutant == "no sinks":
            layer.self_attn.sinks.data.fill_(float("-inf"))
        elif mutant == "no clamp":
            layer.mlp.experts.limit = float("inf")
        else:
            layer.self_attn.sliding_window = None
    prompt = checkpoint.prompts[3]
    ours = paged_runner(model, num_blocks=16, block_size=BLOCK_SIZE).step({0: prompt})[0]
    assert (ours - hf_logits(checkpoint.hf_model, prompt)).abs().max() > 100 * LOGITS_ATOL


def mxfp4_parts(
    shape: tuple[int, int, int], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 blocks and scales of an ``(experts, rows, cols)`` projection."""
    experts, rows, cols = shape
    blocks = torch.randint(256, (experts, rows, cols // 32, 16), generator=generator)
    scales = torch.randint(
        E8M0_BIAS - 5, E8M0_BIAS - 1, (experts, rows, cols // 32), generator=generator
    )
    return blocks.to(torch.uint8), scales.to(torch.uint8)


def test_mxfp4_experts_dequantize_as_transformers_and_match_its_logits(
    tmp_path: Path, paged_runner: Callable[..., Any]
) -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    # MXFP4 groups 32 input features: hidden 64 and intermediate 32 are whole groups.
    hf_model = save_tiny_gpt_oss(tmp_path, **SMALL, **CASES["alternating-yarn"])
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    generator = torch.Generator().manual_seed(2)
    hidden, inter = SMALL["hidden_size"], SMALL["intermediate_size"]
    experts = SMALL["num_local_experts"]
    params = dict(hf_model.named_parameters())
    with torch.no_grad():
        for layer in range(CASES["alternating-yarn"]["num_hidden_layers"]):
            for proj, shape in (
                ("gate_up_proj", (2 * inter, hidden)),
                ("down_proj", (hidden, inter)),
            ):
                name = f"model.layers.{layer}.mlp.experts.{proj}"
                blocks, scales = mxfp4_parts((experts, *shape), generator)
                del tensors[name]
                tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
                expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                torch.testing.assert_close(
                    dequantize_mxfp4(name, blocks, scales), expected, atol=0, rtol=0
                )
                params[name].copy_(expected)
    save_file(tensors, file, metadata={"format": "pt"})
    config_file = tmp_path / "config.json"
    data = json.loads(config_file.read_text())
    data["quantization_config"] = {"quant_method": "mxfp4"}
    config_file.write_text(json.dumps(data))
    config = model_config_from_hf_file(tmp_path)
    assert config.quantization_method == "mxfp4"
    model = load_safetensors_model(tmp_path, config, LoadOptions(device="cpu"))
    prompt = torch.randint(VOCAB_SIZE, (20,), generator=generator).tolist()
    ours = paged_runner(model, num_blocks=16, block_size=BLOCK_SIZE).step({0: prompt})[0]
    with torch.inference_mode():
        expected_logits = hf_model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, expected_logits, atol=LOGITS_ATOL, rtol=0)


def test_an_mxfp4_half_without_the_other_is_named() -> None:
    blocks = torch.zeros(1, 2, 1, 16, dtype=torch.uint8)
    tensors = [("a.gate_up_proj_blocks", blocks), ("a.norm.weight", torch.ones(2))]
    with pytest.raises(CheckpointError, match=r"a\.gate_up_proj lacks a\.gate_up_proj_scales"):
        list(mxfp4_checkpoint_tensors(tensors))


GPT_OSS_120B_DIR = Path(__file__).parent / "data" / "gpt-oss-120b"


def test_the_published_gpt_oss_120b_plan_equals_transformers() -> None:
    config = model_config_from_hf_file(GPT_OSS_120B_DIR)
    assert config.quantization_method == "mxfp4"
    counts = gpt_oss_param_counts(config)
    stack = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    # transformers' GptOssForCausalLM on this config (meta device): 116,829,156,672 parameters,
    # the routers' 36 x 128 x (2880 + 1) among them (float32 here).
    assert stack + counts.layers_fp32 == 116_829_156_672
    assert counts.layers_fp32 == 36 * 128 * (2880 + 1)
    # Dequantized at load: bfloat16 experts, 3.6x the MXFP4 checkpoint's bytes.
    assert weight_bytes(config, 2).total() == 2 * stack + 4 * counts.layers_fp32
    # 18 sliding layers (128 tokens) and 18 full ones, 8 KV heads of 64 each.
    specs = cache_specs(config, indexer_paged=True)
    assert specs[:2] == (
        SlidingWindowSpec(num_kv_heads=8, head_dim=64, sliding_window=128),
        FullAttentionSpec(num_kv_heads=8, head_dim=64),
    )
    assert specs == specs[:2] * 18


def test_what_it_cannot_run_is_refused_by_name(checkpoint: FamilyCheckpoint) -> None:
    scaling = RopeScaling(rope_type="linear", factor=2.0)
    with pytest.raises(ValueError, match="gpt_oss with rope_type 'linear' is not supported"):
        GptOssForCausalLM(attrs.evolve(checkpoint.config, rope_scaling=scaling))
    llama = attrs.evolve(checkpoint.config, model_type="llama", quantization_method="mxfp4")
    with pytest.raises(CheckpointError, match="mxfp4 checkpoints are read for gpt_oss only"):
        load_safetensors_model(checkpoint.path, llama, LoadOptions(device="cpu"))
