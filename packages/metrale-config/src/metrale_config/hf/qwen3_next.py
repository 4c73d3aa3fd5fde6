"""``config.json`` → ``ModelConfig`` for Qwen3-Next (``qwen3_next``): Gated DeltaNet layers and
gated full-attention layers, MoE with one gated shared expert, and its multi-token-prediction
layers (``mtp.*`` in a checkpoint)."""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.llama_like import parse_common
from metrale_config.layer_types import LayerType
from metrale_config.model_config import LinearAttentionConfig, ModelConfig, MoeConfig, MtpConfig

# Where a config.json may count its MTP layers: vLLM's name, then Qwen's own (Qwen3.5's).
MTP_COUNT_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
# vLLM's count when neither is set: Qwen3-Next's released config.json names none, and its
# checkpoints carry one MTP layer.
DEFAULT_MTP_LAYERS = 1


def parse_qwen3_next(reader: FieldReader, model_type: str) -> ModelConfig:
    """transformers' ``Qwen3NextConfig``: ``layer_types`` as given, else every
    ``full_attention_interval``-th layer full attention and the rest linear; partial rotary from
    ``rope_parameters``, else the top-level field, else 0.25; sparse layers where
    ``mlp_only_layers`` and ``decoder_sparse_step`` say; q/k norms and ``(1 + w)`` RMSNorms
    always. MTP layers: as :func:`_parse_mtp` counts them, each a full-attention layer whose
    FFN follows the stack's rule at its index within the MTP layers (as vLLM builds it)."""
    if not reader.has("intermediate_size"):
        reader = attrs.evolve(reader, data={**reader.data, "intermediate_size": 5632})
    config = parse_common(reader, model_type)
    num_layers = config.num_hidden_layers
    partial = reader.number("partial_rotary_factor", 0.25)
    params = reader.child("rope_parameters")
    if params is not None:
        partial = params.number("partial_rotary_factor", partial)
    if not 0.0 < partial <= 1.0:
        raise reader.error("partial_rotary_factor", f"must be in (0, 1], got {partial}")
    attention_bias = reader.boolean("attention_bias", False)
    return attrs.evolve(
        config,
        layer_types=_layer_types(reader, num_layers),
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        qk_norm=True,
        norm_weight_offset=1.0,
        partial_rotary_factor=partial,
        moe=_parse_moe(reader, num_layers),
        linear_attention=_parse_linear_attention(reader),
        mtp=_parse_mtp(reader),
    )


def _layer_types(reader: FieldReader, num_layers: int) -> tuple[LayerType, ...]:
    declared = reader.optional_string_list("layer_types")
    if declared is not None:
        allowed = {LayerType.LINEAR_ATTENTION.value, LayerType.FULL_ATTENTION.value}
        unknown = sorted(set(declared) - allowed)
        if unknown:
            raise reader.error("layer_types", f"may hold only {sorted(allowed)}, got {unknown}")
        return tuple(LayerType(kind) for kind in declared)
    interval = reader.positive_integer("full_attention_interval", 4)
    return tuple(
        LayerType.FULL_ATTENTION if (i + 1) % interval == 0 else LayerType.LINEAR_ATTENTION
        for i in range(num_layers)
    )


def _mlp_layer_types(reader: FieldReader, num_layers: int) -> tuple[str, ...]:
    """transformers' (and vLLM's) rule: layer ``i`` is sparse unless ``mlp_only_layers`` names
    it, there are no experts, or ``decoder_sparse_step`` skips it."""
    num_experts = reader.integer("num_experts", 512)
    sparse_step = reader.positive_integer("decoder_sparse_step", 1)
    dense_layers = set(reader.optional_integer_list("mlp_only_layers") or ())
    return tuple(
        "sparse"
        if i not in dense_layers and num_experts > 0 and (i + 1) % sparse_step == 0
        else "dense"
        for i in range(num_layers)
    )


def _parse_mtp(reader: FieldReader) -> MtpConfig | None:
    """``num_nextn_predict_layers``, else ``mtp_num_hidden_layers``, else
    :data:`DEFAULT_MTP_LAYERS` MTP layers (``None`` for 0). vLLM's ``Qwen3NextMTP`` builds MTP
    layer ``k`` as a full-attention decoder layer of index ``k`` (``mtp.layers.k``), so its FFN
    is the one the stack's rule gives layer ``k``."""
    field = next((name for name in MTP_COUNT_FIELDS if reader.is_set(name)), None)
    num_layers = reader.integer(field) if field is not None else DEFAULT_MTP_LAYERS
    if field is not None and num_layers < 0:
        raise reader.error(field, f"must not be negative, got {num_layers}")
    if num_layers == 0:
        return None
    return MtpConfig(
        num_layers=num_layers,
        layer_types=(LayerType.FULL_ATTENTION,) * num_layers,
        mlp_layer_types=_mlp_layer_types(reader, num_layers),
    )


def _parse_moe(reader: FieldReader, num_layers: int) -> MoeConfig:
    num_experts = reader.integer("num_experts", 512)
    return MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=reader.positive_integer("num_experts_per_tok", 10),
        moe_intermediate_size=reader.positive_integer("moe_intermediate_size", 512),
        num_shared_experts=1,
        shared_expert_intermediate_size=reader.positive_integer(
            "shared_expert_intermediate_size", 512
        ),
        norm_topk_prob=reader.boolean("norm_topk_prob", True),
        mlp_layer_types=_mlp_layer_types(reader, num_layers),
    )


def _parse_linear_attention(reader: FieldReader) -> LinearAttentionConfig:
    num_key_heads = reader.positive_integer("linear_num_key_heads", 16)
    num_value_heads = reader.positive_integer("linear_num_value_heads", 32)
    if num_value_heads % num_key_heads:
        raise reader.error(
            "linear_num_value_heads",
            f"({num_value_heads}) must be a multiple of linear_num_key_heads ({num_key_heads})",
        )
    return LinearAttentionConfig(
        num_heads=num_value_heads,
        head_dim=reader.positive_integer("linear_key_head_dim", 128),
        conv_kernel_dim=reader.positive_integer("linear_conv_kernel_dim", 4),
        num_key_heads=num_key_heads,
        value_head_dim=reader.positive_integer("linear_value_head_dim", 128),
    )
