"""Our own FP8 writer (:mod:`metrale_model_arch.fp8_quantize`): e4m3's rounding bound per
element, what a stream of weights becomes on disk, and the other tensors' dtype. (What the
layouts load as: ``test_fp8_checkpoints.py``.)"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from metrale_model_arch.fp8_quantize import (
    BLOCK_128,
    Fp8Layout,
    dequantized,
    quantize_fp8,
    write_fp8_checkpoint,
)

LAYOUTS = [
    BLOCK_128,
    Fp8Layout(method="fp8", granularity="block", block=(32, 48)),
    Fp8Layout(method="compressed-tensors", granularity="channel"),
    Fp8Layout(method="compressed-tensors", granularity="tensor"),
]
# e4m3: 3 mantissa bits, so a normal value rounds within 2^-4 of itself; below 2^-6 (times the
# scale) the subnormals' step is 2^-9, so half of it.
RELATIVE_STEP = 2.0**-4
SUBNORMAL_HALF_STEP = 2.0**-10


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: f"{layout.method}-{layout.block}")
def test_each_weight_rounds_within_e4m3s_step(layout: Fp8Layout) -> None:
    weight = torch.randn(200, 300, generator=torch.Generator().manual_seed(0))
    weight[:, :7] *= 50  # outlier columns: the blocks and rows that hold them scale larger
    q, scale = quantize_fp8(weight, layout)
    assert q.dtype == torch.float8_e4m3fn
    values = dequantized(q, scale, layout)
    element_scale = dequantized(torch.ones_like(q), scale, layout)
    allowed = torch.maximum(weight.abs() * RELATIVE_STEP, element_scale * SUBNORMAL_HALF_STEP)
    assert bool(((values - weight).abs() <= allowed * (1 + 1e-6)).all())
    assert float(values.abs().max()) == pytest.approx(float(weight.abs().max()), rel=1e-6)


def test_a_stream_is_written_in_the_layout(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    weights = {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=generator),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(160, 32, generator=generator),
        "model.layers.0.input_layernorm.weight": torch.ones(32),
        "model.layers.0.mlp.gate.weight": torch.randn(4, 32, generator=generator),
        "lm_head.weight": torch.randn(64, 32, generator=generator),
    }
    taken: list[str] = []

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights.items():
            taken.append(name)
            yield name, tensor

    write_fp8_checkpoint(
        tmp_path, {"model_type": "llama"}, stream(), BLOCK_128, float_dtype=torch.bfloat16
    )
    assert taken == list(weights)
    stored = load_file(str(tmp_path / "model.safetensors"))
    proj = "model.layers.0.self_attn.q_proj"
    assert stored[f"{proj}.weight"].dtype == torch.float8_e4m3fn
    assert stored[f"{proj}.weight_scale_inv"].shape == (2, 1)  # 160 rows: one block and a part
    kept = set(weights) - {f"{proj}.weight"}
    assert {name for name in stored if stored[name].dtype == torch.bfloat16} == kept
    assert torch.equal(stored["lm_head.weight"], weights["lm_head.weight"].bfloat16())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert config["quantization_config"] == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "modules_to_not_convert": ["lm_head"],
        "weight_block_size": [128, 128],
    }


# sha256 of round to nearest's q and scale for a pinned weight, as written before GPTQ's
# rounding existed (the same bytes: a writer given no Hessian is round to nearest, unchanged).
ROUND_TO_NEAREST_SHA256 = {
    "block": "742fd76c82a5cf6d81b4df8daf7af6affdaaa4810f93f0d77db645ef8cdcecbc",
    "channel": "5b3a9447490a6fdbbc31cb3f81003ab8d65303ea9119159ba5da14d6ef6942ae",
}


@pytest.mark.parametrize("layout", [BLOCK_128, LAYOUTS[2]], ids=lambda layout: layout.granularity)
def test_round_to_nearest_writes_the_bytes_it_wrote_before_gptq(layout: Fp8Layout) -> None:
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    q, scale = quantize_fp8(weight, layout)
    digest = hashlib.sha256()
    for name, tensor in sorted({"q": q, "s": scale}.items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    assert digest.hexdigest() == ROUND_TO_NEAREST_SHA256[layout.granularity]
