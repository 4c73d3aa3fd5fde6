"""``glm5_next`` / ``glm5_next_text`` (GLM-5.3): MLA + DSA layers, KDA linear attention, MoE, MHC.

Defaults and derived schedules follow transformers' ``Glm5NextTextConfig``; the multimodal
wrapper's ``text_config`` is read when present, else the top-level fields (a flat checkpoint).
Its ``vision_config`` (and the top-level image/video token ids) becomes ``ModelConfig.vision``;
a config without one (a flat text-only checkpoint) has no vision tower.
"""

from __future__ import annotations

from collections.abc import Mapping

from metrale_config.fields import FieldReader
from metrale_config.hf.common import (
    map_layer_type,
    parse_dtype,
    parse_mtp,
    parse_quantization_method,
)
from metrale_config.layer_types import LayerType
from metrale_config.model_config import (
    DsaConfig,
    LinearAttentionConfig,
    MhcConfig,
    MlaConfig,
    ModelConfig,
    MoeConfig,
    VisionConfig,
)

SPARSE = LayerType.SPARSE_ATTENTION
LINEAR = LayerType.LINEAR_ATTENTION
# Every attention layer of glm5_next is a DSA layer, whatever its config calls it.
LAYER_TYPE_NAMES: Mapping[str, LayerType] = {
    "indexed_attention": SPARSE,
    "full_attention": SPARSE,
    SPARSE.value: SPARSE,
    LINEAR.value: LINEAR,
}
_INDEXER_PATTERN_NAMES = {"F": "full", "S": "shared"}
_NUM_LEADING_DENSE_LAYERS = 3


def parse_glm5_next(reader: FieldReader, model_type: str) -> ModelConfig:
    outer = reader
    text = reader.child("text_config") if model_type == "glm5_next" else None
    r = text or reader
    num_layers = r.positive_integer("num_hidden_layers")
    num_heads = r.positive_integer("num_attention_heads")
    num_kv_heads = r.optional_integer("num_key_value_heads", num_heads)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_kv_heads != num_heads:
        raise r.error(
            "num_key_value_heads",
            f"must equal num_attention_heads ({num_heads}), got {num_kv_heads}",
        )
    mla = _parse_mla(r)
    attention_bias = r.boolean("attention_bias", False)
    tie_reader = outer if outer.has("tie_word_embeddings") else r
    return ModelConfig(
        source=reader.source,
        model_type=model_type,
        architectures=outer.optional_string_list("architectures")
        or r.optional_string_list("architectures")
        or (),
        vocab_size=r.integer("vocab_size"),
        hidden_size=r.integer("hidden_size"),
        intermediate_size=r.integer("intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        hidden_act=r.string("hidden_act", "silu"),
        rms_norm_eps=r.number("rms_norm_eps", 1e-5),
        max_position_embeddings=r.integer("max_position_embeddings", 1048576),
        tie_word_embeddings=tie_reader.boolean("tie_word_embeddings", False),
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        bos_token_id=r.optional_integer("bos_token_id"),
        eos_token_ids=r.optional_integer_list("eos_token_id") or (),
        pad_token_id=r.optional_integer("pad_token_id", 154820),
        torch_dtype=parse_dtype(r) or parse_dtype(outer),
        layer_types=_layer_types(r, num_layers),
        moe=_parse_moe(r, num_layers),
        mla=mla,
        dsa=_parse_dsa(r, num_layers),
        linear_attention=_parse_linear_attention(r),
        mtp=parse_mtp(r, LAYER_TYPE_NAMES) or parse_mtp(outer, LAYER_TYPE_NAMES),
        quantization_method=parse_quantization_method(r) or parse_quantization_method(outer),
        mhc=MhcConfig(
            num_streams=r.positive_integer("hc_mult", 4),
            eps=r.number("hc_eps", 1e-6),
            num_sinkhorn_iters=r.positive_integer("hc_sinkhorn_iters", 20),
        ),
        swiglu_limit=r.optional_number("swiglu_limit", 10.0),
        vision=_parse_vision(outer) if model_type == "glm5_next" else None,
    )


def _parse_vision(outer: FieldReader) -> VisionConfig | None:
    v = outer.child("vision_config")
    if v is None:
        return None
    rope = v.child("rope_parameters")
    if rope is not None and rope.string("rope_type", "axial") != "axial":
        raise rope.error("rope_type", "must be 'axial' (the tower's 2D rotary)")
    return VisionConfig(
        depth=v.positive_integer("depth", 24),
        hidden_size=v.positive_integer("hidden_size", 1024),
        num_heads=v.positive_integer("num_heads", 16),
        intermediate_size=v.positive_integer("intermediate_size", 4096),
        out_hidden_size=v.positive_integer("out_hidden_size", 1536),
        projection_intermediate_size=v.positive_integer("projection_intermediate_size", 10240),
        in_channels=v.positive_integer("in_channels", 3),
        patch_size=v.positive_integer("patch_size", 14),
        temporal_patch_size=v.positive_integer("temporal_patch_size", 2),
        spatial_merge_size=v.positive_integer("spatial_merge_size", 2),
        hidden_act=v.string("hidden_act", "silu"),
        attention_bias=v.boolean("attention_bias", True),
        rms_norm_eps=v.number("rms_norm_eps", 1e-5),
        rope_theta=rope.number("rope_theta", 10000.0) if rope is not None else 10000.0,
        swiglu_limit=v.optional_number("swiglu_limit", 10.0),
        image_token_id=outer.integer("image_token_id", 154854),
        video_token_id=outer.optional_integer("video_token_id", 154855),
        video_start_token_id=outer.optional_integer("video_start_token_id", 154832),
        video_end_token_id=outer.optional_integer("video_end_token_id", 154833),
    )


def _layer_types(r: FieldReader, num_layers: int) -> tuple[LayerType, ...]:
    declared = r.optional_string_list("layer_types")
    if declared is None:
        return tuple(LINEAR if i % 4 != 3 else SPARSE for i in range(num_layers))
    return tuple(map_layer_type(r, "layer_types", kind, LAYER_TYPE_NAMES) for kind in declared)


def _parse_mla(r: FieldReader) -> MlaConfig:
    qk_rope_head_dim = r.integer("qk_rope_head_dim", 0)
    if qk_rope_head_dim != 0:
        raise r.error(
            "qk_rope_head_dim", f"must be 0 (glm5_next has no RoPE), got {qk_rope_head_dim}"
        )
    return MlaConfig(
        q_lora_rank=_optional_positive(r, "q_lora_rank", 1536),
        kv_lora_rank=r.positive_integer("kv_lora_rank", 512),
        qk_nope_head_dim=r.positive_integer("qk_nope_head_dim", 256),
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=r.positive_integer("v_head_dim", 256),
    )


def _optional_positive(r: FieldReader, name: str, default: int) -> int | None:
    value = r.optional_integer(name, default)
    return None if value is None else r.positive_integer(name, default)


def _parse_dsa(r: FieldReader, num_layers: int) -> DsaConfig:
    index_topk = r.positive_integer("index_topk", 2048)
    index_kpool = r.integer("index_kpool", 16)
    if index_kpool < 1:
        raise r.error("index_kpool", f"must be at least 1, got {index_kpool}")
    if index_topk % index_kpool != 0:
        raise r.error(
            "index_topk", f"({index_topk}) must be a multiple of index_kpool ({index_kpool})"
        )
    return DsaConfig(
        index_n_heads=r.positive_integer("index_n_heads", 32),
        index_head_dim=r.positive_integer("index_head_dim", 128),
        index_topk=index_topk,
        index_kpool=index_kpool,
        index_kpool_always_select_tail=r.boolean("index_kpool_always_select_tail", True),
        indexer_types=_indexer_types(r, num_layers),
    )


def _indexer_types(r: FieldReader, num_layers: int) -> tuple[str, ...]:
    declared = r.optional_string_list("indexer_types")
    if declared is not None:
        return declared
    if r.is_set("index_topk_pattern"):
        pattern = r.data["index_topk_pattern"]
        if isinstance(pattern, str):
            unknown = sorted(set(pattern) - set(_INDEXER_PATTERN_NAMES))
            if unknown:
                raise r.error("index_topk_pattern", f"may hold only 'F' and 'S', got {unknown}")
            return tuple(_INDEXER_PATTERN_NAMES[letter] for letter in pattern)
        return r.optional_string_list("index_topk_pattern") or ()
    freq = max(r.integer("index_topk_freq", 1), 1)
    offset = r.integer("index_skip_topk_offset", 2)
    return tuple(
        "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)
    )


def _parse_linear_attention(r: FieldReader) -> LinearAttentionConfig:
    head_dim = r.positive_integer("linear_head_dim", 128)
    num_heads = r.positive_integer("linear_num_heads", 64)
    conv_kernel_dim = r.positive_integer("linear_conv_kernel_dim", 4)
    lower_bound = r.optional_number("linear_lower_bound", -5.0)
    kimi = r.child("linear_attn_config")
    if kimi is not None:
        head_dim = kimi.positive_integer("head_dim", head_dim)
        num_heads = kimi.positive_integer("num_heads", num_heads)
        conv_kernel_dim = kimi.positive_integer("short_conv_kernel_size", conv_kernel_dim)
        lower_bound = kimi.optional_number("gate_lower_bound", lower_bound)
        if kimi.boolean("safe_gate", True) and lower_bound is None:
            lower_bound = -5.0
    return LinearAttentionConfig(
        num_heads=num_heads,
        head_dim=head_dim,
        conv_kernel_dim=conv_kernel_dim,
        lower_bound=lower_bound,
    )


def _parse_moe(r: FieldReader, num_layers: int) -> MoeConfig:
    name = "n_routed_experts" if r.has("n_routed_experts") else "num_local_experts"
    moe_intermediate_size = r.positive_integer("moe_intermediate_size", 2048)
    num_shared_experts = r.integer("n_shared_experts", 1)
    if num_shared_experts < 0:
        raise r.error("n_shared_experts", f"must not be negative, got {num_shared_experts}")
    mlp_layer_types = r.optional_string_list("mlp_layer_types")
    if mlp_layer_types is None:
        num_dense = min(_NUM_LEADING_DENSE_LAYERS, num_layers)
        mlp_layer_types = ("dense",) * num_dense + ("sparse",) * (num_layers - num_dense)
    return MoeConfig(
        num_experts=r.positive_integer(name, 288),
        num_experts_per_tok=r.positive_integer("num_experts_per_tok", 8),
        moe_intermediate_size=moe_intermediate_size,
        num_shared_experts=num_shared_experts,
        shared_expert_intermediate_size=(
            moe_intermediate_size * num_shared_experts if num_shared_experts > 0 else None
        ),
        norm_topk_prob=r.boolean("norm_topk_prob", True),
        routed_scaling_factor=r.number("routed_scaling_factor", 2.5),
        n_group=r.positive_integer("n_group", 1),
        topk_group=r.positive_integer("topk_group", 1),
        mlp_layer_types=mlp_layer_types,
    )
