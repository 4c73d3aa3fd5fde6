"""``gemma3`` (Gemma 3 with images): a ``gemma3_text`` stack in ``text_config`` and a SigLIP
tower in ``vision_config`` (``ModelConfig.siglip_vision``).

transformers fills a sparse ``text_config`` (the published checkpoints name a handful of fields)
from ``Gemma3TextConfig``'s defaults, and so does this parser. ``architectures``,
``tie_word_embeddings``, ``eos_token_id``, the dtype and the quantization method are read from
the top level where it sets them. A config without ``vision_config`` has no tower.
"""

from __future__ import annotations

import math

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import parse_dtype, parse_quantization_method
from metrale_config.hf.dense_families import parse_gemma3_text
from metrale_config.model_config import ModelConfig
from metrale_config.siglip_vision import SiglipVisionConfig

# Gemma3TextConfig's defaults for the fields the text parser needs set.
_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
}


def parse_gemma3(reader: FieldReader, model_type: str) -> ModelConfig:
    text = reader.child("text_config")
    text_reader = FieldReader(
        source=reader.source,
        data={**_TEXT_DEFAULTS, **(text.data if text is not None else {})},
        prefix="text_config.",
    )
    config = parse_gemma3_text(text_reader, "gemma3_text")
    eos_token_ids = reader.optional_integer_list("eos_token_id")
    return attrs.evolve(
        config,
        model_type=model_type,
        architectures=reader.optional_string_list("architectures") or config.architectures,
        tie_word_embeddings=reader.boolean("tie_word_embeddings", config.tie_word_embeddings),
        eos_token_ids=config.eos_token_ids if eos_token_ids is None else eos_token_ids,
        torch_dtype=parse_dtype(reader) or config.torch_dtype,
        quantization_method=parse_quantization_method(reader) or config.quantization_method,
        siglip_vision=_parse_siglip(reader),
    )


def _parse_siglip(outer: FieldReader) -> SiglipVisionConfig | None:
    v = outer.child("vision_config")
    if v is None:
        return None
    image_size = v.positive_integer("image_size", 224)
    patch_size = v.positive_integer("patch_size", 16)
    if image_size % patch_size:
        raise v.error(
            "image_size", f"({image_size}) must be a multiple of patch_size ({patch_size})"
        )
    hidden_size = v.positive_integer("hidden_size", 768)
    num_heads = v.positive_integer("num_attention_heads", 12)
    if hidden_size % num_heads:
        raise v.error(
            "hidden_size",
            f"({hidden_size}) must be a multiple of num_attention_heads ({num_heads})",
        )
    num_tokens = outer.positive_integer("mm_tokens_per_image", 256)
    side, patches = math.isqrt(num_tokens), image_size // patch_size
    if side * side != num_tokens or patches % side:
        raise outer.error(
            "mm_tokens_per_image",
            f"must be a square whose side divides the {patches} patches a side of an image, "
            f"got {num_tokens}",
        )
    return SiglipVisionConfig(
        num_hidden_layers=v.positive_integer("num_hidden_layers", 12),
        hidden_size=hidden_size,
        intermediate_size=v.positive_integer("intermediate_size", 3072),
        num_attention_heads=num_heads,
        num_channels=v.positive_integer("num_channels", 3),
        image_size=image_size,
        patch_size=patch_size,
        hidden_act=v.string("hidden_act", "gelu_pytorch_tanh"),
        layer_norm_eps=v.number("layer_norm_eps", 1e-6),
        mm_tokens_per_image=num_tokens,
        image_token_id=_token_id(outer, "image_token", 262_144),
        boi_token_id=_token_id(outer, "boi_token", 255_999),
        eoi_token_id=_token_id(outer, "eoi_token", 256_000),
    )


def _token_id(outer: FieldReader, name: str, default: int) -> int:
    """``<name>_index`` (what transformers saves) or ``<name>_id`` (its attribute's name)."""
    if outer.has(f"{name}_index"):
        return outer.integer(f"{name}_index")
    return outer.integer(f"{name}_id", default)
