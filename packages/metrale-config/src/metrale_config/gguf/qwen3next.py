"""GGUF metadata of Qwen3-Next (``qwen3next``, llama.cpp's ``Qwen3NextModel``).

The Gated DeltaNet sizes are the ``ssm`` keys: ``state_size`` the key head dim, ``group_count``
the key heads, ``time_step_rank`` the value heads, ``inner_size`` all value heads' width,
``conv_kernel`` the short convolution. Layer ``i`` is linear where ``attention.recurrent_layers``
flags it, or, without that key, full attention when ``(i + 1) % full_attention_interval == 0``
(llama.cpp's default interval 4) and linear otherwise;
``rope.dimension_count`` is the rotated part of a head. llama.cpp fixes the rest: the routed
experts softmaxed with the top-k renormalized, one sigmoid-gated shared expert per layer, q/k
norms, and ``(1 + w)`` RMSNorms (stored as ``1 + w``; the loader shifts them back). The
converter drops the MTP layers (``mtp.*``), so a file has none.
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.layer_types import LayerType
from metrale_config.model_config import LinearAttentionConfig, ModelConfig, MoeConfig

QWEN3NEXT_ARCHITECTURE = "qwen3next"
DEFAULT_FULL_ATTENTION_INTERVAL = 4


def with_qwen3next(config: ModelConfig, reader: FieldReader, header: GgufHeader) -> ModelConfig:
    """``config`` (read as a llama-like stack) as Qwen3-Next's hybrid layers and experts."""
    arch = QWEN3NEXT_ARCHITECTURE
    layer_types = _layer_types(reader, config.num_hidden_layers)
    first_full = next(
        (i for i, kind in enumerate(layer_types) if kind == LayerType.FULL_ATTENTION), None
    )
    attention_bias = first_full is not None and header.has_tensor(f"blk.{first_full}.attn_q.bias")
    rotary_dims = reader.positive_integer(f"{arch}.rope.dimension_count")
    if rotary_dims > config.head_dim:
        raise reader.error(
            f"{arch}.rope.dimension_count", f"must not exceed the head dim ({config.head_dim})"
        )
    return attrs.evolve(
        config,
        model_type="qwen3_next",
        layer_types=layer_types,
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        qk_norm=True,
        norm_weight_offset=1.0,
        partial_rotary_factor=rotary_dims / config.head_dim,
        moe=_moe(reader, header, config.num_hidden_layers),
        linear_attention=_linear_attention(reader),
    )


def _layer_types(reader: FieldReader, num_layers: int) -> tuple[LayerType, ...]:
    """``attention.recurrent_layers`` (one flag per block, newer files) when present, else the
    full-attention interval."""
    flags_key = f"{QWEN3NEXT_ARCHITECTURE}.attention.recurrent_layers"
    if reader.has(flags_key):
        flags = reader.data[flags_key]
        is_flag_list = isinstance(flags, list) and all(isinstance(f, bool) for f in flags)
        if not isinstance(flags, list) or not is_flag_list or len(flags) < num_layers:
            raise reader.error(flags_key, f"must hold a boolean for each of {num_layers} layers")
        return tuple(
            LayerType.LINEAR_ATTENTION if is_recurrent else LayerType.FULL_ATTENTION
            for is_recurrent in flags[:num_layers]
        )
    interval = reader.positive_integer(
        f"{QWEN3NEXT_ARCHITECTURE}.full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL
    )
    return tuple(
        LayerType.FULL_ATTENTION if (i + 1) % interval == 0 else LayerType.LINEAR_ATTENTION
        for i in range(num_layers)
    )


def _moe(reader: FieldReader, header: GgufHeader, num_layers: int) -> MoeConfig:
    """A layer is sparse when it has a router (``ffn_gate_inp``); each sparse layer needs its
    shared expert's gate too."""
    arch = QWEN3NEXT_ARCHITECTURE
    shared_size_key = f"{arch}.expert_shared_feed_forward_length"
    kinds = tuple(
        "sparse" if header.has_tensor(f"blk.{i}.ffn_gate_inp.weight") else "dense"
        for i in range(num_layers)
    )
    for i, kind in enumerate(kinds):
        if kind == "sparse" and not header.has_tensor(f"blk.{i}.ffn_gate_inp_shexp.weight"):
            raise reader.error(
                shared_size_key,
                f"names a shared expert, but blk.{i} lacks its gate (ffn_gate_inp_shexp)",
            )
    return MoeConfig(
        num_experts=reader.positive_integer(f"{arch}.expert_count"),
        num_experts_per_tok=reader.positive_integer(f"{arch}.expert_used_count"),
        moe_intermediate_size=reader.positive_integer(f"{arch}.expert_feed_forward_length"),
        num_shared_experts=1,
        shared_expert_intermediate_size=reader.positive_integer(shared_size_key),
        norm_topk_prob=True,
        mlp_layer_types=kinds,
    )


def _linear_attention(reader: FieldReader) -> LinearAttentionConfig:
    prefix = f"{QWEN3NEXT_ARCHITECTURE}.ssm"
    num_key_heads = reader.positive_integer(f"{prefix}.group_count")
    num_value_heads = reader.positive_integer(f"{prefix}.time_step_rank")
    if num_value_heads % num_key_heads:
        raise reader.error(
            f"{prefix}.time_step_rank",
            f"({num_value_heads}) must be a multiple of ssm.group_count ({num_key_heads})",
        )
    inner_size = reader.positive_integer(f"{prefix}.inner_size")
    if inner_size % num_value_heads:
        raise reader.error(
            f"{prefix}.inner_size",
            f"({inner_size}) must be a multiple of ssm.time_step_rank ({num_value_heads})",
        )
    return LinearAttentionConfig(
        num_heads=num_value_heads,
        head_dim=reader.positive_integer(f"{prefix}.state_size"),
        conv_kernel_dim=reader.positive_integer(f"{prefix}.conv_kernel"),
        num_key_heads=num_key_heads,
        value_head_dim=inner_size // num_value_heads,
    )
