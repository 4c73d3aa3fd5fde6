"""The vectorized dequantizer gives exactly ``gguf.quants``' floats, block format by format."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from metrale_model_arch.gguf_dequant import dequantize

FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q6_K"]  # Q6_K: the fallback to gguf.quants


@pytest.mark.parametrize("name", FORMATS)
def test_equals_the_gguf_package_bit_for_bit(name: str) -> None:
    ggml_type = gguf.GGMLQuantizationType[name]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[ggml_type]
    rng = np.random.default_rng(7)
    num_blocks = 6
    raw = rng.integers(0, 256, size=(3, 5, num_blocks * block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    scales = rng.standard_normal((blocks.shape[0], 2)).astype(np.float16)
    if name in {"Q8_0", "Q4_0", "Q4_1"}:
        blocks[:, :4] = scales.view(np.uint8)  # finite f16 scale (and Q4_1's minimum)
    else:
        blocks[:, -2:] = scales[:, :1].view(np.uint8)  # Q6_K keeps its scale last
    ours = dequantize(raw, ggml_type)
    reference = np.asarray(gguf.quants.dequantize(raw, ggml_type), dtype=np.float32)
    assert ours.dtype == np.float32
    assert ours.shape == (3, 5, num_blocks * block_values)
    np.testing.assert_array_equal(ours, reference)
