"""GGUF metadata of Qwen2.5-VL's text stack (llama.cpp's ``qwen2vl`` architecture, converter
class ``Qwen2VLModel``): Qwen2's keys and M-RoPE's ``rope.dimension_sections``.

The converter pads ``mrope_section`` to four sections with zeros; the fourth (llama.cpp's
M-RoPE "extra" section) must be 0 here, as transformers has three. Without an mmproj the file
loads as ``qwen2_5_vl`` without a tower (a text-only load).
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.model_config import ModelConfig

QWEN2VL_ARCHITECTURE = "qwen2vl"
QWEN2VL_MODEL_TYPE = "qwen2_5_vl"
NUM_MROPE_SECTIONS = 3


def with_qwen2vl(config: ModelConfig, reader: FieldReader, arch: str) -> ModelConfig:
    """``config`` with its M-RoPE sections (read from ``rope.dimension_sections``)."""
    key = f"{arch}.rope.dimension_sections"
    sections = reader.optional_integer_list(key)
    if sections is None:
        raise reader.error(key, "is missing (Qwen2.5-VL's M-RoPE sections)")
    used, extra = sections[:NUM_MROPE_SECTIONS], sections[NUM_MROPE_SECTIONS:]
    half_head_dim = config.head_dim // 2
    if len(used) != NUM_MROPE_SECTIONS or any(extra) or min(used) < 0:
        raise reader.error(key, f"must be three sizes (then zeros), got {list(sections)}")
    if sum(used) != half_head_dim:
        raise reader.error(
            key, f"must sum to head_dim // 2 ({half_head_dim}), got {list(sections)}"
        )
    return attrs.evolve(config, mrope_section=tuple(used), qkv_bias=True)
