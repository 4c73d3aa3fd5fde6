"""``qwen2_5_vl`` (Qwen2.5-VL): a Qwen2 text stack with multimodal RoPE, and a vision tower.

The text fields are read from ``text_config`` when present (a transformers-5 save), else from
the top level (the hub's flat configs), with transformers' ``Qwen2_5_VLTextConfig`` defaults.
``mrope_section`` comes from ``rope_parameters`` / ``rope_scaling`` (whose old ``mrope`` type
means plain RoPE); ``vision_config`` and the top-level token ids become ``ModelConfig.vision``
(a config without one has no tower).
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import map_layer_type, parse_dtype
from metrale_config.hf.llama_like import parse_common
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig, VisionConfig

FULL = LayerType.FULL_ATTENTION
SLIDING = LayerType.SLIDING_ATTENTION
_LAYER_TYPE_NAMES = {FULL.value: FULL, SLIDING.value: SLIDING}
DEFAULT_MROPE_SECTION = (16, 24, 24)
DEFAULT_FULL_ATTENTION_BLOCKS = (7, 15, 23, 31)


def parse_qwen2_5_vl(reader: FieldReader, model_type: str) -> ModelConfig:
    outer = reader
    r = reader.child("text_config") or reader
    config = parse_common(r, model_type)
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type == "mrope":
        scaling = None
    window, layer_types = _attention_layout(r, config.num_hidden_layers)
    tied = outer.boolean("tie_word_embeddings", False) or (
        r is not outer and r.boolean("tie_word_embeddings", False)
    )
    return attrs.evolve(
        config,
        architectures=outer.optional_string_list("architectures") or config.architectures,
        rope_scaling=scaling,
        mrope_section=_mrope_section(r, config.head_dim),
        sliding_window=window,
        layer_types=layer_types,
        qkv_bias=True,
        o_proj_bias=False,
        tie_word_embeddings=tied,
        torch_dtype=config.torch_dtype or parse_dtype(outer),
        vision=_parse_vision(outer),
    )


def _mrope_section(r: FieldReader, head_dim: int) -> tuple[int, ...]:
    params = r.child("rope_scaling")
    if params is None or not params.data:
        params = r.child("rope_parameters")
    declared = params.optional_integer_list("mrope_section") if params is not None else None
    section = declared or DEFAULT_MROPE_SECTION
    if len(section) != 3 or min(section) < 0 or sum(section) != head_dim // 2:
        raise (params or r).error(
            "mrope_section",
            f"must be three sizes summing to head_dim // 2 ({head_dim // 2}), got {list(section)}",
        )
    return tuple(section)


def _attention_layout(r: FieldReader, num_layers: int) -> tuple[int | None, tuple[LayerType, ...]]:
    """As transformers' ``Qwen2_5_VLTextConfig``: windows only with ``use_sliding_window``."""
    window = r.optional_integer("sliding_window", 4096)
    if not r.boolean("use_sliding_window", False) or window is None:
        return None, (FULL,) * num_layers
    declared = r.optional_string_list("layer_types")
    if declared is not None:
        return window, tuple(
            map_layer_type(r, "layer_types", kind, _LAYER_TYPE_NAMES) for kind in declared
        )
    first_sliding = r.integer("max_window_layers", 80)
    return window, tuple(SLIDING if i >= first_sliding else FULL for i in range(num_layers))


def _parse_vision(outer: FieldReader) -> VisionConfig | None:
    v = outer.child("vision_config")
    if v is None:
        return None
    rope = v.child("rope_parameters")
    if rope is not None and rope.string("rope_type", "axial") != "axial":
        raise rope.error("rope_type", "must be 'axial' (the tower's 2D rotary)")
    depth = v.positive_integer("depth", 32)
    hidden_size = v.positive_integer("hidden_size", 3584)
    patch_size = v.positive_integer("patch_size", 14)
    merge_size = v.positive_integer("spatial_merge_size", 2)
    window_size = v.positive_integer("window_size", 112)
    if window_size < patch_size * merge_size:
        raise v.error(
            "window_size",
            f"({window_size}) must hold a merged patch ({patch_size * merge_size} pixels)",
        )
    full_blocks = v.optional_integer_list("fullatt_block_indexes")
    full_blocks = DEFAULT_FULL_ATTENTION_BLOCKS if full_blocks is None else full_blocks
    return VisionConfig(
        depth=depth,
        hidden_size=hidden_size,
        num_heads=v.positive_integer("num_heads", 16),
        intermediate_size=v.positive_integer("intermediate_size", 3420),
        out_hidden_size=v.positive_integer("out_hidden_size", 3584),
        # The merger's MLP is as wide as a merged block of patches.
        projection_intermediate_size=hidden_size * merge_size**2,
        in_channels=v.positive_integer("in_channels", 3),
        patch_size=patch_size,
        temporal_patch_size=v.positive_integer("temporal_patch_size", 2),
        spatial_merge_size=merge_size,
        hidden_act=v.string("hidden_act", "silu"),
        attention_bias=True,
        rms_norm_eps=1e-6,
        rope_theta=rope.number("rope_theta", 10000.0) if rope is not None else 10000.0,
        image_token_id=outer.integer("image_token_id", 151655),
        video_token_id=outer.optional_integer("video_token_id", 151656),
        window_size=window_size,
        fullatt_block_indexes=full_blocks,
        vision_start_token_id=outer.optional_integer("vision_start_token_id", 151652),
        vision_end_token_id=outer.optional_integer("vision_end_token_id", 151653),
    )
