"""A dense llama-family layer's two segments as single ops of the kernel backend
(``llama_qkv_step`` and ``llama_output_step``: the cpu backend's native
``metrale::int8_qkv_step`` and ``metrale::int8_output_step``), for int8 or q4 weights and
float32 activations on the CPU; and a decode-only step's whole layer, attention included, as
one (``llama_decode_layer``).

Each replaces the segment's ~50 small ops (eager) or a ``torch.compile``'d graph, whose guard
checks and wrappers cost ~80 µs a call at batch 1, 60 calls a step. They compute the same
function as :func:`~metrale_model_arch.families.llama.layer_qkv` and ``layer_output`` with
the reference ops, each row's arithmetic fixed by that row alone (float32 rounding apart: the
norm's and the activation's sums run in another order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from metrale_kernels import AttentionMetadata
from metrale_model_arch.families.base import CausalLM, LayerCache
from metrale_model_arch.families.int8_layers import Int8Linear
from metrale_model_arch.families.llama import (
    LayerExecutor,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
)
from metrale_model_arch.families.q4_layers import Q4Linear


def can_run_native_steps(model: CausalLM) -> bool:
    """Whether ``model`` is a dense llama-family model with plain int8 or q4 projections (not split
    over ranks), float32 on the CPU, without q/k norms, on a backend whose native ops are
    loaded."""
    if not isinstance(model, LlamaForCausalLM) or not model.has_dense_layers:
        return False
    native = getattr(model.backend, "native", None)
    if native is None or model.model.cos_sin_cache.device.type != "cpu":
        return False
    if model.config.hidden_act != "silu":
        return False
    for layer in cast("Sequence[LlamaDecoderLayer]", model.model.layers):
        attention, mlp = layer.self_attn, layer.mlp
        assert isinstance(mlp, LlamaMLP)
        linears: tuple[nn.Module, ...] = (
            attention.qkv_proj,
            attention.o_proj,
            mlp.gate_up_proj,
            mlp.down_proj,
        )
        if any(type(linear) not in (Int8Linear, Q4Linear) for linear in linears):
            return False
        if attention.q_norm is not None or layer.input_layernorm.weight.dtype != torch.float32:
            return False
    return True


def _weights(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A projection's matrix, its scales and its bias, as the native ops take them: int8 and
    float32 row scales, or q4's packed blocks and float16 block scales."""
    if isinstance(linear, Q4Linear):
        return linear.packed, linear.scales, linear.bias
    assert isinstance(linear, Int8Linear)
    return linear.qweight, linear.scale, linear.bias


def native_layer_qkv(
    layer: LlamaDecoderLayer, hidden: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attention, norm = layer.self_attn, layer.input_layernorm
    return attention.backend.llama_qkv_step(
        hidden,
        norm.weight,
        norm.eps,
        *_weights(attention.qkv_proj),
        positions,
        cos_sin,
        attention.num_heads,
        attention.num_kv_heads,
        attention.head_dim,
    )


def native_layer_output(
    layer: LlamaDecoderLayer, hidden: torch.Tensor, attended: torch.Tensor
) -> torch.Tensor:
    attention, norm = layer.self_attn, layer.post_attention_layernorm
    mlp = cast(LlamaMLP, layer.mlp)
    return attention.backend.llama_output_step(
        hidden,
        attended,
        *_weights(attention.o_proj),
        norm.weight,
        norm.eps,
        *_weights(mlp.gate_up_proj),
        *_weights(mlp.down_proj),
    )


def native_decode_layer(
    layer: LlamaDecoderLayer,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    kv_cache: LayerCache,
    metadata: AttentionMetadata,
) -> torch.Tensor:
    """A decode-only step's whole layer in one call (token ``t`` is sequence ``t``'s query);
    a sliding-window layer writes and reads its cache by its window's view of the step."""
    attention, mlp = layer.self_attn, cast(LlamaMLP, layer.mlp)
    metadata = metadata.for_window(attention.sliding_window)
    k_cache, v_cache = kv_cache
    return attention.backend.llama_decode_layer(
        hidden,
        positions,
        cos_sin,
        layer.input_layernorm.weight,
        layer.input_layernorm.eps,
        *_weights(attention.qkv_proj),
        attention.num_heads,
        attention.num_kv_heads,
        attention.head_dim,
        k_cache,
        v_cache,
        metadata.slot_mapping,
        metadata.block_tables,
        metadata.seq_lens_tensor,
        attention.sliding_window or 0,
        attention.scale,
        *_weights(attention.o_proj),
        layer.post_attention_layernorm.weight,
        *_weights(mlp.gate_up_proj),
        *_weights(mlp.down_proj),
    )


NATIVE_EXECUTOR = LayerExecutor(
    "native", native_layer_qkv, native_layer_output, native_decode_layer
)


def native_executor(model: CausalLM) -> LayerExecutor | None:
    """The native executor when :func:`can_run_native_steps`, else ``None``."""
    return NATIVE_EXECUTOR if can_run_native_steps(model) else None
