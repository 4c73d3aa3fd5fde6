"""Qwen3-Next's GGUF metadata (``qwen3next``): the hybrid layers from the full-attention
interval (llama.cpp's default 4 when absent), the Gated DeltaNet sizes from the ``ssm`` keys,
sparse layers where a router is, and sizes that do not divide refused by name (the round trip
from a real checkpoint is metrale-model-arch's ``test_gguf_qwen3_next``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from metrale_config import (
    ConfigError,
    LayerType,
    LinearAttentionConfig,
    model_config_from_gguf,
    model_config_from_gguf_header,
    read_gguf_header,
)

TinyGguf = Callable[..., Path]
ARCH = "qwen3next"
KEYS = {
    "block_count": 4,
    "attention__key_length": 8,
    "rope__dimension_count": 2,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 16,
    "expert_shared_feed_forward_length": 24,
    "ssm__conv_kernel": 4,
    "ssm__state_size": 12,
    "ssm__group_count": 2,
    "ssm__time_step_rank": 4,
    "ssm__inner_size": 32,
}
# Each layer's router and shared expert gate.
SPARSE_LAYERS = {
    **{f"blk.{i}.ffn_gate_inp.weight": (4, 32) for i in range(4)},
    **{f"blk.{i}.ffn_gate_inp_shexp.weight": (1, 32) for i in range(4)},
}
LINEAR, FULL = LayerType.LINEAR_ATTENTION, LayerType.FULL_ATTENTION


def test_sizes_and_layers_from_the_file(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf(ARCH, tensors=SPARSE_LAYERS, **KEYS))
    assert config.model_type == "qwen3_next"
    assert config.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert config.linear_attention == LinearAttentionConfig(
        num_heads=4, head_dim=12, conv_kernel_dim=4, num_key_heads=2, value_head_dim=8
    )
    assert (config.partial_rotary_factor, config.norm_weight_offset) == (0.25, 1.0)
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("sparse",) * 4
    assert (config.moe.num_shared_experts, config.moe.shared_expert_intermediate_size) == (1, 24)
    assert config.moe.norm_topk_prob
    assert config.mtp is None


def test_the_interval_places_full_attention(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(ARCH, tensors=SPARSE_LAYERS, full_attention_interval=2, **KEYS)
    assert model_config_from_gguf(path).layer_types == (LINEAR, FULL, LINEAR, FULL)


def test_a_sparse_layer_without_its_shared_expert_gate_is_refused(tiny_gguf: TinyGguf) -> None:
    tensors = dict(SPARSE_LAYERS)
    del tensors["blk.2.ffn_gate_inp_shexp.weight"]
    with pytest.raises(ConfigError, match=re.escape("blk.2 lacks its gate (ffn_gate_inp_shexp)")):
        model_config_from_gguf(tiny_gguf(ARCH, tensors=tensors, **KEYS))


@pytest.mark.parametrize(("key", "value"), [("ssm__time_step_rank", 3), ("ssm__inner_size", 30)])
def test_sizes_that_do_not_divide_are_refused(tiny_gguf: TinyGguf, key: str, value: int) -> None:
    path = tiny_gguf(ARCH, tensors=SPARSE_LAYERS, **{**KEYS, key: value})
    with pytest.raises(ConfigError, match=re.escape(f"'{ARCH}.{key.replace('__', '.')}'")):
        model_config_from_gguf(path)


def test_recurrent_layer_flags_override_the_interval(tiny_gguf: TinyGguf) -> None:
    header = read_gguf_header(tiny_gguf(ARCH, tensors=SPARSE_LAYERS, **KEYS))
    flags_key = f"{ARCH}.attention.recurrent_layers"
    # Newer converters write one flag per block (MTP blocks past the stack included).
    fields = {**header.fields, flags_key: [False, True, True, False, False]}
    config = model_config_from_gguf_header(attrs.evolve(header, fields=fields))
    assert config.layer_types == (FULL, LINEAR, LINEAR, FULL)
    too_few = {**header.fields, flags_key: [True, False]}
    with pytest.raises(ConfigError, match=re.escape(f"'{flags_key}' must hold a boolean")):
        model_config_from_gguf_header(attrs.evolve(header, fields=too_few))
