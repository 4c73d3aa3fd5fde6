"""``kimi_linear`` (Kimi Linear): KDA linear-attention layers and NoPE MLA layers, interleaved;
dense MLPs before ``first_k_dense_replace``, then DeepSeek-V3's MoE.

Defaults and derived schedules follow transformers' ``KimiLinearConfig``, which reads both its
own names and the published checkpoint's (``num_experts``, ``num_experts_per_token``,
``moe_renormalize``, ``num_expert_group``, ``num_shared_experts``, ``model_max_length``, the
``linear_attn_config`` object with 1-based ``kda_layers`` / ``full_attn_layers``). Its MLA
rotates nothing: the ``qk_rope_head_dim`` dims are cached and scored unrotated
(``MlaConfig.is_rotary`` false); a config with ``mla_use_nope`` false is refused. KDA's forget
gate has no lower bound. ``moe_layer_freq`` is ignored, as transformers does.
"""

from __future__ import annotations

from metrale_config.fields import FieldReader
from metrale_config.hf.common import map_layer_type, parse_dtype, parse_quantization_method
from metrale_config.layer_types import LayerType
from metrale_config.model_config import LinearAttentionConfig, MlaConfig, ModelConfig, MoeConfig

FULL = LayerType.FULL_ATTENTION
LINEAR = LayerType.LINEAR_ATTENTION
LAYER_TYPE_NAMES = {FULL.value: FULL, LINEAR.value: LINEAR}
# transformers' attribute names, then the published checkpoint's.
_ALIASES = {
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_token",
    "norm_topk_prob": "moe_renormalize",
    "n_group": "num_expert_group",
    "n_shared_experts": "num_shared_experts",
    "max_position_embeddings": "model_max_length",
}


def _name(r: FieldReader, name: str) -> str:
    """``name`` or its checkpoint spelling, whichever the file sets."""
    alias = _ALIASES[name]
    return alias if not r.is_set(name) and r.is_set(alias) else name


def parse_kimi_linear(r: FieldReader, model_type: str) -> ModelConfig:
    num_layers = r.positive_integer("num_hidden_layers", 27)
    num_heads = r.positive_integer("num_attention_heads", 32)
    if not r.boolean("mla_use_nope", True):
        raise r.error("mla_use_nope", "must be true (transformers' Kimi Linear MLA has no RoPE)")
    if r.string("hidden_act", "silu") != "silu":
        raise r.error("hidden_act", "must be 'silu' (KDA's short convolution and the MLPs)")
    mla = MlaConfig(
        q_lora_rank=_optional_positive(r, "q_lora_rank"),
        kv_lora_rank=r.positive_integer("kv_lora_rank", 512),
        qk_nope_head_dim=r.positive_integer("qk_nope_head_dim", 128),
        qk_rope_head_dim=r.positive_integer("qk_rope_head_dim", 64),
        v_head_dim=r.positive_integer("v_head_dim", 128),
        rope_interleave=False,
        is_rotary=False,
    )
    attention_bias = r.boolean("attention_bias", False)
    return ModelConfig(
        source=r.source,
        model_type=model_type,
        architectures=r.optional_string_list("architectures") or (),
        vocab_size=r.positive_integer("vocab_size", 163840),
        hidden_size=r.positive_integer("hidden_size", 2304),
        intermediate_size=r.positive_integer("intermediate_size", 9216),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        # Every head reads the one cached latent.
        num_key_value_heads=num_heads,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        hidden_act="silu",
        rms_norm_eps=r.number("rms_norm_eps", 1e-5),
        max_position_embeddings=r.positive_integer(_name(r, "max_position_embeddings"), 1048576),
        tie_word_embeddings=r.boolean("tie_word_embeddings", False),
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        bos_token_id=r.optional_integer("bos_token_id", 163584),
        eos_token_ids=r.optional_integer_list("eos_token_id") or (),
        pad_token_id=r.optional_integer("pad_token_id", 163839),
        torch_dtype=parse_dtype(r),
        layer_types=_layer_types(r, num_layers),
        moe=_parse_moe(r, num_layers),
        mla=mla,
        linear_attention=_parse_linear_attention(r),
        quantization_method=parse_quantization_method(r),
    )


def _optional_positive(r: FieldReader, name: str) -> int | None:
    return r.positive_integer(name) if r.is_set(name) else None


def _layer_types(r: FieldReader, num_layers: int) -> tuple[LayerType, ...]:
    declared = r.optional_string_list("layer_types")
    if declared is not None:
        return tuple(map_layer_type(r, "layer_types", kind, LAYER_TYPE_NAMES) for kind in declared)
    linear = r.child("linear_attn_config")
    if linear is not None and linear.is_set("full_attn_layers") and linear.is_set("kda_layers"):
        kinds: list[LayerType | None] = [None] * num_layers
        for field, kind in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
            for number in linear.optional_integer_list(field) or ():
                if not 1 <= number <= num_layers:
                    raise linear.error(field, f"has layer {number} outside 1..{num_layers}")
                kinds[number - 1] = kind
        missing = [i + 1 for i, kind in enumerate(kinds) if kind is None]
        if missing:
            raise linear.error("kda_layers", f"and full_attn_layers leave out layers {missing}")
        return tuple(kind for kind in kinds if kind is not None)
    return tuple(FULL if i and i % 4 == 0 else LINEAR for i in range(num_layers))


def _parse_linear_attention(r: FieldReader) -> LinearAttentionConfig:
    head_dim = r.positive_integer("linear_head_dim", 128)
    num_heads = r.positive_integer("linear_num_heads", 32)
    conv_kernel_dim = r.positive_integer("linear_conv_kernel_dim", 4)
    linear = r.child("linear_attn_config")
    if linear is not None:
        head_dim = linear.positive_integer("head_dim", head_dim)
        num_heads = linear.positive_integer("num_heads", num_heads)
        conv_kernel_dim = linear.positive_integer("short_conv_kernel_size", conv_kernel_dim)
    return LinearAttentionConfig(
        num_heads=num_heads, head_dim=head_dim, conv_kernel_dim=conv_kernel_dim, lower_bound=None
    )


def _parse_moe(r: FieldReader, num_layers: int) -> MoeConfig:
    num_experts = r.positive_integer(_name(r, "num_local_experts"), 256)
    n_group = r.positive_integer(_name(r, "n_group"), 1)
    topk_group = r.positive_integer("topk_group", 1)
    if num_experts % n_group or topk_group > n_group:
        raise r.error(
            "topk_group",
            f"({topk_group}) must be at most n_group ({n_group}), which must divide the "
            f"{num_experts} experts",
        )
    num_shared = r.integer(_name(r, "n_shared_experts"), 1)
    if num_shared < 0:
        raise r.error("n_shared_experts", f"must not be negative, got {num_shared}")
    moe_intermediate_size = r.positive_integer("moe_intermediate_size", 1024)
    mlp_layer_types = r.optional_string_list("mlp_layer_types")
    if mlp_layer_types is None:
        first_dense = r.integer("first_k_dense_replace", 1)
        mlp_layer_types = tuple("dense" if i < first_dense else "sparse" for i in range(num_layers))
    return MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=r.positive_integer(_name(r, "num_experts_per_tok"), 8),
        moe_intermediate_size=moe_intermediate_size,
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=moe_intermediate_size * num_shared or None,
        norm_topk_prob=r.boolean(_name(r, "norm_topk_prob"), True),
        routed_scaling_factor=r.number("routed_scaling_factor", 2.446),
        n_group=n_group,
        topk_group=topk_group,
        mlp_layer_types=mlp_layer_types,
    )
