"""Kimi Linear's GGUF metadata (``kimi-linear``): the layers placed by the per-layer kv head
counts (a list only this architecture may hold there), KDA's heads from ``head_count``, the MLA
and MoE keys as DeepSeek's with llama.cpp's fixed renormalization, and files it cannot run
refused by name (the round trip from a real checkpoint is metrale-model-arch's
``test_gguf_kimi_linear``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from metrale_config import (
    ConfigError,
    LayerType,
    LinearAttentionConfig,
    MlaConfig,
    model_config_from_gguf_header,
    read_gguf_header,
)

TinyGguf = Callable[..., Path]
ARCH = "kimi-linear"
KEYS = {
    "block_count": 4,
    "attention__head_count_kv": 1,
    "attention__key_length": 20,
    "attention__value_length": 4,
    "attention__key_length_mla": 12,
    "attention__value_length_mla": 8,
    "attention__kv_lora_rank": 16,
    "rope__dimension_count": 4,
    "rope__freq_base": 50000.0,
    "kda__head_dim": 8,
    "ssm__conv_kernel": 3,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 16,
    "expert_shared_count": 1,
    "leading_dense_block_count": 1,
    "expert_weights_scale": 2.5,
    "expert_gating_func": 2,
}
TENSORS = {f"blk.{i}.exp_probs_b.bias": (4,) for i in range(1, 4)}
KV_HEADS = [0, 1, 0, 1]
LINEAR, FULL = LayerType.LINEAR_ATTENTION, LayerType.FULL_ATTENTION


def header_with(path: Path, **fields: Any) -> Any:
    """``path``'s header with ``fields`` (full key names; ``None`` removes the key)."""
    header = read_gguf_header(path)
    merged = {**header.fields, **fields}
    return attrs.evolve(header, fields={k: v for k, v in merged.items() if v is not None})


def kimi_header(tiny_gguf: TinyGguf, **fields: Any) -> Any:
    path = tiny_gguf(ARCH, tensors=TENSORS, **KEYS)
    return header_with(path, **{f"{ARCH}.attention.head_count_kv": KV_HEADS, **fields})


def test_sizes_and_layers_from_the_file(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf_header(kimi_header(tiny_gguf))
    assert config.model_type == "kimi_linear"
    assert config.layer_types == (LINEAR, FULL, LINEAR, FULL)
    assert config.num_key_value_heads == config.num_attention_heads == 4
    assert config.linear_attention == LinearAttentionConfig(
        num_heads=4, head_dim=8, conv_kernel_dim=3, lower_bound=None
    )
    assert config.mla == MlaConfig(
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        rope_interleave=False,
        is_rotary=False,
    )
    # Nothing rotates: the file's freq_base describes nothing.
    assert (config.head_dim, config.rope_theta) == (12, 10000.0)
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("dense", "sparse", "sparse", "sparse")
    assert (config.moe.num_shared_experts, config.moe.routed_scaling_factor) == (1, 2.5)
    assert config.moe.norm_topk_prob


@pytest.mark.parametrize("counts", [1, [0, 1, 0]], ids=["one-integer", "too-few"])
def test_kv_heads_not_listed_per_layer_are_refused(tiny_gguf: TinyGguf, counts: Any) -> None:
    header = kimi_header(tiny_gguf, **{f"{ARCH}.attention.head_count_kv": counts})
    key = f"'{ARCH}.attention.head_count_kv' must list a kv head count for each of 4 layers"
    with pytest.raises(ConfigError, match=re.escape(key)):
        model_config_from_gguf_header(header)


def test_a_per_layer_kv_head_list_stays_refused_elsewhere(tiny_gguf: TinyGguf) -> None:
    header = header_with(tiny_gguf("llama"), **{"llama.attention.head_count_kv": [2, 2]})
    with pytest.raises(ConfigError, match=re.escape("'llama.attention.head_count_kv'")):
        model_config_from_gguf_header(header)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("expert_gating_func", 1, "must be 2 (sigmoid"),
        ("hidden_act", "situ", "must be 'silu'"),
        ("attention.q_lora_rank", 24, "is set, but blk.1's query projection"),
    ],
)
def test_what_this_family_cannot_run_is_refused(
    tiny_gguf: TinyGguf, key: str, value: Any, problem: str
) -> None:
    header = kimi_header(tiny_gguf, **{f"{ARCH}.{key}": value})
    with pytest.raises(ConfigError, match=re.escape(f"'{ARCH}.{key}' {problem}")):
        model_config_from_gguf_header(header)


def test_experts_without_the_correction_bias_are_refused(tiny_gguf: TinyGguf) -> None:
    header = kimi_header(tiny_gguf)
    tensors = tuple(info for info in header.tensors if "exp_probs_b" not in info.name)
    with pytest.raises(ConfigError, match=re.escape("lacks the routing correction bias")):
        model_config_from_gguf_header(attrs.evolve(header, tensors=tensors))
