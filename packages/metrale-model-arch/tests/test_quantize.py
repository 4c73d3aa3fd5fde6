"""Quantizing a checkpoint (:mod:`metrale_model_arch.quantize`): the defaults each method
resolves to, every request that cannot be written refused by its field, and the output written
a shard at a time."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file

from metrale_config import ModelConfig
from metrale_model_arch.calibration import Calibration
from metrale_model_arch.model_source import ModelSource
from metrale_model_arch.quantize import (
    QuantizeError,
    QuantizeMethod,
    QuantizeSpec,
    quantize_checkpoint,
    resolve_spec,
)
from metrale_model_arch.quantized_checkpoint import ShardedCheckpointWriter

AWQ, GPTQ, FP8 = QuantizeMethod.AWQ, QuantizeMethod.GPTQ, QuantizeMethod.FP8


@pytest.fixture
def config(tiny_config: ModelConfig) -> ModelConfig:
    """Projections of 32 (q/k/v, gate/up, o) and 96 (down) input features."""
    return attrs.evolve(tiny_config, intermediate_size=96)


@pytest.mark.parametrize(
    ("spec", "group_size", "is_symmetric"),
    [
        (QuantizeSpec(method=AWQ), 32, False),  # 32 and 96 features: not 128 or 64
        (QuantizeSpec(method=GPTQ), 32, True),
        (QuantizeSpec(method=GPTQ, is_symmetric=False), 32, False),
        (QuantizeSpec(method=FP8), None, True),
    ],
)
def test_the_defaults(
    config: ModelConfig, spec: QuantizeSpec, group_size: int | None, is_symmetric: bool
) -> None:
    resolved = resolve_spec(config, spec)
    assert (resolved.group_size, resolved.is_symmetric) == (group_size, is_symmetric)


def test_the_default_group_is_128_where_it_divides(config: ModelConfig) -> None:
    config = attrs.evolve(config, hidden_size=256, intermediate_size=512, head_dim=64)
    assert resolve_spec(config, QuantizeSpec(method=AWQ)).group_size == 128


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            QuantizeSpec(method=AWQ, group_size=64),
            "group_size",
            "64 does not divide q/k/v/gate/up_proj's 32 input",
        ),
        (QuantizeSpec(method=AWQ, group_size=16), "group_size", "not a multiple of 32"),
        (QuantizeSpec(method=FP8, group_size=128), "group_size", "applies to awq and gptq"),
        (QuantizeSpec(method=AWQ, is_symmetric=True), "is_symmetric", "AWQ has zero points"),
        (QuantizeSpec(method=FP8, is_symmetric=False), "is_symmetric", "fp8 has no zero points"),
    ],
)
def test_what_cannot_be_written_is_named(
    config: ModelConfig, spec: QuantizeSpec, field: str, message: str
) -> None:
    with pytest.raises(QuantizeError, match=message) as caught:
        resolve_spec(config, spec)
    assert caught.value.field == field


def test_int4_is_the_llama_familys(config: ModelConfig) -> None:
    config = attrs.evolve(config, model_type="gemma2")
    with pytest.raises(QuantizeError, match="not gemma2; fp8 is written for any") as caught:
        resolve_spec(config, QuantizeSpec(method=GPTQ))
    assert caught.value.field == "method"


@pytest.mark.parametrize(
    ("model_type", "num_tokens", "is_file", "field", "message"),
    [
        ("gemma2", 64, True, "calibration", "is read for the llama family"),
        ("llama", 1, True, "calibration_tokens", "1 is fewer than 2"),
        ("llama", 64, False, "calibration", "is not a file"),
    ],
)
def test_a_calibration_that_cannot_be_read_is_named(
    config: ModelConfig,
    tmp_path: Path,
    model_type: str,
    num_tokens: int,
    is_file: bool,
    field: str,
    message: str,
) -> None:
    text = tmp_path / "text.txt"
    if is_file:
        text.write_text("Some words to read.")
    calibration = Calibration(text_path=text, num_tokens=num_tokens)
    spec = QuantizeSpec(method=FP8, calibration=calibration)
    with pytest.raises(QuantizeError, match=message) as caught:
        resolve_spec(attrs.evolve(config, model_type=model_type), spec)
    assert caught.value.field == field


def test_a_quantized_checkpoint_is_refused(tmp_path: Path) -> None:
    config = {"model_type": "llama", "quantization_config": {"quant_method": "gptq"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = ModelSource(kind="dir", path=tmp_path, name=str(tmp_path))
    with pytest.raises(QuantizeError, match="is quantized already \\(gptq\\)") as caught:
        quantize_checkpoint(source, tmp_path / "out", QuantizeSpec(method=FP8))
    assert caught.value.field == "model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_the_writer_writes_each_shard_once_it_is_full(tmp_path: Path) -> None:
    """A shard is on disk before the next tensor is held, not at ``finish``: the output is
    never held whole."""
    writer = ShardedCheckpointWriter(tmp_path, max_shard_bytes=100)
    tensors = {f"t{i}": torch.full((10,), float(i)) for i in range(5)}  # 40 bytes each
    written_before = []
    for name, tensor in tensors.items():
        writer.add(name, tensor)
        written_before.append(len(list(tmp_path.glob("*.safetensors"))))
    assert written_before == [0, 0, 1, 1, 2]  # two tensors a shard
    writer.finish({"model_type": "llama"}, {"quant_method": "fp8"})
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {
        "t0": "model-00001-of-00003.safetensors",
        "t1": "model-00001-of-00003.safetensors",
        "t2": "model-00002-of-00003.safetensors",
        "t3": "model-00002-of-00003.safetensors",
        "t4": "model-00003-of-00003.safetensors",
    }
    stored = {}
    for path in tmp_path.glob("*.safetensors"):
        stored.update(load_file(str(path)))
    assert stored.keys() == tensors.keys()
    assert all(torch.equal(stored[name], tensors[name]) for name in tensors)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == {"model_type": "llama", "quantization_config": {"quant_method": "fp8"}}


def test_one_shard_is_named_as_a_single_file(tmp_path: Path) -> None:
    writer = ShardedCheckpointWriter(tmp_path)
    writer.add("t", torch.ones(3))
    writer.finish({}, {})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
