"""GGUF metadata of Kimi Linear (``kimi-linear``, llama.cpp's ``KimiLinearModel``).

``attention.head_count_kv`` holds one count per layer: 0 marks a KDA layer, anything else an
MLA layer (the converter writes 1, MLA as one latent kv head). KDA's sizes are ``kda.head_dim``
and ``ssm.conv_kernel``; its heads are ``attention.head_count`` (llama.cpp sizes KDA by it, the
checkpoint's ``linear_attn_config.num_heads`` is not written). MLA's are DeepSeek's keys
(``attention.q_lora_rank``, absent for a full-rank ``attn_q``; ``kv_lora_rank``;
``key_length_mla`` / ``value_length_mla``; ``rope.dimension_count`` the unrotated dims). The
MoE keys are DeepSeek's, ``leading_dense_block_count`` dense layers first.

llama.cpp fixes the rest: no position encoding anywhere (the rope keys describe nothing that
rotates), no attention biases, the routed top-k always renormalized, and KDA's forget gate
unbounded. The routing must be sigmoid (``expert_gating_func`` 2) with its correction bias,
the one routing this family runs.
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.gguf.header import GgufHeader
from metrale_config.gguf.shared_expert_moe import read_shared_expert_moe
from metrale_config.layer_types import LayerType
from metrale_config.model_config import LinearAttentionConfig, MlaConfig, ModelConfig

KIMI_LINEAR_ARCHITECTURE = "kimi-linear"
SIGMOID_GATING = 2
CORRECTION_BIAS_TENSOR = "exp_probs_b.bias"
# What the checkpoint parser leaves (ModelConfig's default): nothing rotates.
UNUSED_ROPE_THETA = 10000.0


def with_kimi_linear(config: ModelConfig, reader: FieldReader, header: GgufHeader) -> ModelConfig:
    """``config`` (read as a llama-like stack) as Kimi Linear's KDA and MLA layers and MoE."""
    arch = KIMI_LINEAR_ARCHITECTURE
    hidden_act = reader.string(f"{arch}.hidden_act", "silu")
    if hidden_act != "silu":
        raise reader.error(f"{arch}.hidden_act", f"must be 'silu', got {hidden_act!r}")
    layer_types = kimi_linear_layer_types(reader, config.num_hidden_layers)
    mla = _mla(reader, header, layer_types)
    moe = read_shared_expert_moe(reader, arch, config.num_hidden_layers)
    _check_sigmoid_routing(reader, header, any(kind == "sparse" for kind in moe.mlp_layer_types))
    return attrs.evolve(
        config,
        model_type="kimi_linear",
        layer_types=layer_types,
        num_key_value_heads=config.num_attention_heads,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        rope_theta=UNUSED_ROPE_THETA,
        qkv_bias=False,
        o_proj_bias=False,
        mla=mla,
        moe=attrs.evolve(moe, norm_topk_prob=True),
        linear_attention=LinearAttentionConfig(
            num_heads=config.num_attention_heads,
            head_dim=reader.positive_integer(f"{arch}.kda.head_dim"),
            conv_kernel_dim=reader.positive_integer(f"{arch}.ssm.conv_kernel"),
            lower_bound=None,
        ),
    )


def kimi_linear_layer_types(reader: FieldReader, num_layers: int) -> tuple[LayerType, ...]:
    """KDA where ``attention.head_count_kv`` is 0, MLA elsewhere."""
    key = f"{KIMI_LINEAR_ARCHITECTURE}.attention.head_count_kv"
    counts = reader.optional_integer_list(key)
    if counts is None or not isinstance(reader.data[key], list) or len(counts) != num_layers:
        raise reader.error(key, f"must list a kv head count for each of {num_layers} layers")
    return tuple(
        LayerType.LINEAR_ATTENTION if count == 0 else LayerType.FULL_ATTENTION for count in counts
    )


def _mla(reader: FieldReader, header: GgufHeader, layer_types: tuple[LayerType, ...]) -> MlaConfig:
    arch = KIMI_LINEAR_ARCHITECTURE
    rope_dims = reader.positive_integer(f"{arch}.rope.dimension_count")
    key_length_key = f"{arch}.attention.key_length_mla"
    qk_head_dim = reader.positive_integer(key_length_key)
    if qk_head_dim <= rope_dims:
        raise reader.error(key_length_key, f"must exceed rope.dimension_count ({rope_dims})")
    q_lora_key = f"{arch}.attention.q_lora_rank"
    q_lora_rank = reader.optional_integer(q_lora_key)
    if q_lora_rank is not None:
        q_lora_rank = reader.positive_integer(q_lora_key)
    mla_layers = [i for i, kind in enumerate(layer_types) if kind == LayerType.FULL_ATTENTION]
    if mla_layers:
        first = mla_layers[0]
        if header.has_tensor(f"blk.{first}.attn_q_a.weight") != (q_lora_rank is not None):
            problem = "is missing" if q_lora_rank is None else "is set"
            raise reader.error(
                q_lora_key, f"{problem}, but blk.{first}'s query projection says otherwise"
            )
    return MlaConfig(
        q_lora_rank=q_lora_rank,
        kv_lora_rank=reader.positive_integer(f"{arch}.attention.kv_lora_rank"),
        qk_nope_head_dim=qk_head_dim - rope_dims,
        qk_rope_head_dim=rope_dims,
        v_head_dim=reader.positive_integer(f"{arch}.attention.value_length_mla"),
        rope_interleave=False,
        is_rotary=False,
    )


def _check_sigmoid_routing(reader: FieldReader, header: GgufHeader, has_experts: bool) -> None:
    gating_key = f"{KIMI_LINEAR_ARCHITECTURE}.expert_gating_func"
    gating = reader.integer(gating_key)
    if gating != SIGMOID_GATING:
        raise reader.error(gating_key, f"must be 2 (sigmoid, Kimi Linear's routing), got {gating}")
    has_bias = any(info.name.endswith(CORRECTION_BIAS_TENSOR) for info in header.tensors)
    if has_experts and not has_bias:
        raise reader.error(
            gating_key,
            f"is sigmoid, but the file lacks the routing correction bias "
            f"(blk.N.{CORRECTION_BIAS_TENSOR}) that Kimi Linear adds",
        )
