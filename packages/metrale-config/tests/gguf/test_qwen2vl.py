"""Qwen2.5-VL's text GGUF (``qwen2vl``): Qwen2's keys and M-RoPE's ``rope.dimension_sections``
(padded to four by the converter), refused by name when they do not fit the heads (the round
trip from a real checkpoint, with its mmproj, is metrale-model-arch's ``test_gguf_mmproj``)."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import pytest

from metrale_config import ConfigError, model_config_from_gguf

KEY = "qwen2vl.rope.dimension_sections"


def write_qwen2vl(path: Path, sections: list[int] | None) -> Path:
    """Two layers of 32 wide, 4 heads of 8 (4 rotary frequencies a head)."""
    writer = gguf.GGUFWriter(path, "qwen2vl")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1000000.0)
    if sections is not None:
        writer.add_rope_dimension_sections(sections)
    writer.add_token_list([f"t{i}" for i in range(40)])
    shapes = {"token_embd.weight": (40, 32), "output_norm.weight": (32,),
              "blk.0.attn_q.bias": (32,)}  # fmt: skip
    for name, shape in shapes.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_sections_are_the_first_three(tmp_path: Path) -> None:
    config = model_config_from_gguf(write_qwen2vl(tmp_path / "m.gguf", [1, 1, 2, 0]))
    assert config.model_type == "qwen2_5_vl"
    assert config.mrope_section == (1, 1, 2)
    assert config.qkv_bias
    assert config.vision is None


@pytest.mark.parametrize(
    ("sections", "problem"),
    [
        (None, "is missing"),
        ([1, 1, 1, 1], "must be three sizes (then zeros)"),
        ([2, 2, 2, 0], "must sum to head_dim // 2 (4)"),
    ],
    ids=["missing", "a-fourth-section", "wrong-sum"],
)
def test_sections_that_do_not_fit_are_refused(
    tmp_path: Path, sections: list[int] | None, problem: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"field '{KEY}' {problem}")):
        model_config_from_gguf(write_qwen2vl(tmp_path / "m.gguf", sections))
