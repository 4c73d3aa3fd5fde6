"""Quantize a float checkpoint (an HF safetensors directory, or a GGUF file dequantized) into
an AWQ, GPTQ or FP8 safetensors directory that the loaders read, with its tokenizer files.

The weights stream from the source one at a time into :mod:`~metrale_model_arch.int4_quantize`
or :mod:`~metrale_model_arch.fp8_quantize`, and the output is written a shard at a time: what is
held is one float weight and one shard.
With a calibration text (:class:`~metrale_model_arch.calibration.Calibration`; the llama
family only), the float model is first rounded a layer at a time as GPTQ does
(:mod:`~metrale_model_arch.sequential_calibration`), each projection's Hessian from its inputs
through the layers rounded before it; each projection's rounding, as it is stored (int4 levels
or e4m3 values and their scales), is held while the weights stream and written as it is in
place of the projection (each rounded once). GPTQ's act-order (``is_act_order``, ``desc_act``)
rounds each projection's columns by decreasing Hessian diagonal, its groups formed in that
order.
The directory is written beside ``out`` and renamed into place when complete.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

from metrale_config import (
    Int4Method,
    ModelConfig,
    model_config_from_gguf_header,
    model_config_from_hf_file,
    read_gguf_header,
)
from metrale_model_arch.calibration import Calibration
from metrale_model_arch.chat_template import CHAT_TEMPLATE_FILE, GGUF_CHAT_TEMPLATE_KEY
from metrale_model_arch.fp8_quantize import (
    BLOCK_128,
    Fp8Layout,
    Fp8Weight,
    gptq_fp8,
    is_fp8_target,
)
from metrale_model_arch.fp8_quantize import write_fp8_checkpoint as write_fp8
from metrale_model_arch.int4_format import INT4_MODEL_TYPES
from metrale_model_arch.int4_gptq import gptq_int4
from metrale_model_arch.int4_quantize import PROJECTION, Int4Levels, write_int4_checkpoint
from metrale_model_arch.loading.gguf_loader import iter_gguf_weights
from metrale_model_arch.loading.safetensors_loader import checkpoint_tensor_names, iter_safetensors
from metrale_model_arch.model_source import ModelSource
from metrale_model_arch.quantized_checkpoint import (
    CHECKPOINT_FILES,
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_BYTES,
    hf_config,
)
from metrale_model_arch.sequential_calibration import (
    RoundedT,
    RoundedWeight,
    Rounding,
    sequential_rounding,
)
from metrale_model_arch.tokenizer import Tokenizer

# Tried in turn when no group size is given: AutoAWQ's and GPTQ's default first.
DEFAULT_GROUP_SIZES = (128, 64, 32)
# A group is whole q4 blocks of 32, so the CPU's q4 kernels serve it as it is.
GROUP_MULTIPLE = 32


class QuantizeMethod(enum.StrEnum):
    AWQ = "awq"
    GPTQ = "gptq"
    FP8 = "fp8"


class QuantizeError(ValueError):
    """A request that cannot be written; ``field`` names the :class:`QuantizeSpec` field (or
    ``model``, ``out``) at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@attrs.frozen(kw_only=True)
class QuantizeSpec:
    """What to write. ``group_size`` (int4 only): input features per scale, ``None`` for the
    first of ``DEFAULT_GROUP_SIZES`` that divides every projection's; ``is_symmetric``
    (``None``: AWQ asymmetric, GPTQ and fp8 symmetric; AWQ always has zero points, fp8 never);
    ``fp8_layout``: fp8's layout (DeepSeek's 128 x 128 blocks); ``float_dtype``: the tensors
    not quantized (``None``: float16 for int4, the source's dtype for fp8);
    ``max_shard_bytes``: the most a safetensors file of the output holds; ``calibration``: the
    text GPTQ's rounding is calibrated on (``None``: round to nearest); ``is_act_order``:
    GPTQ's act-order (``desc_act``; gptq with a calibration only)."""

    method: QuantizeMethod
    group_size: int | None = None
    is_symmetric: bool | None = None
    fp8_layout: Fp8Layout = BLOCK_128
    float_dtype: torch.dtype | None = None
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    calibration: Calibration | None = None
    is_act_order: bool = False


@attrs.frozen(kw_only=True)
class QuantizeReport:
    """What was written: the spec as resolved, each file's bytes, and the weights' parameters
    and bytes, split into the quantized ones (scales, zeros included) and the rest."""

    out: Path
    spec: QuantizeSpec
    file_bytes: tuple[tuple[str, int], ...]
    num_quantized_params: int
    num_kept_params: int
    quantized_bytes: int
    kept_bytes: int
    source_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.file_bytes)


@attrs.frozen(kw_only=True)
class FloatCheckpoint:
    config: ModelConfig
    hf: dict[str, Any]  # config.json's fields
    weights: Iterator[tuple[str, torch.Tensor]]
    source_bytes: int


def projection_in_features(config: ModelConfig) -> dict[str, int]:
    """Input features of each llama-family projection."""
    head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
    hidden = config.hidden_size
    return {"q/k/v/gate/up_proj": hidden, "o_proj": config.num_attention_heads * head_dim,
            "down_proj": config.intermediate_size}  # fmt: skip


def resolve_spec(config: ModelConfig, spec: QuantizeSpec) -> QuantizeSpec:
    """``spec`` with its defaults filled in for ``config``; :class:`QuantizeError` when it
    cannot be written."""
    if spec.max_shard_bytes <= 0:
        raise QuantizeError("max_shard_bytes", f"{spec.max_shard_bytes} is not a positive size")
    if spec.is_act_order and spec.method != QuantizeMethod.GPTQ:
        raise QuantizeError("is_act_order", f"is GPTQ's (desc_act), not {spec.method}'s")
    if spec.is_act_order and spec.calibration is None:
        raise QuantizeError(
            "is_act_order", "needs a calibration: it orders the columns by their inputs' Hessian"
        )
    if spec.calibration is not None:
        check_calibration(config, spec.calibration)
    if spec.method == QuantizeMethod.FP8:
        if spec.group_size is not None:
            raise QuantizeError("group_size", "applies to awq and gptq (fp8 scales 128x128 blocks)")
        if spec.is_symmetric is False:
            raise QuantizeError("is_symmetric", "fp8 has no zero points: it is symmetric")
        return attrs.evolve(spec, is_symmetric=True)
    if config.model_type not in INT4_MODEL_TYPES:
        supported = ", ".join(sorted(INT4_MODEL_TYPES))
        raise QuantizeError(
            "method",
            f"{spec.method} int4 is written for the llama family ({supported}), not "
            f"{config.model_type}; fp8 is written for any",
        )
    if spec.method == QuantizeMethod.AWQ and spec.is_symmetric:
        raise QuantizeError("is_symmetric", "AWQ has zero points: symmetric is GPTQ's")
    features = projection_in_features(config)
    group_size = spec.group_size
    if group_size is None:
        group_size = next(
            (size for size in DEFAULT_GROUP_SIZES if not any(f % size for f in features.values())),
            None,
        )
        if group_size is None:
            raise QuantizeError("group_size", f"none of {DEFAULT_GROUP_SIZES} divides {features}")
    elif group_size <= 0 or group_size % GROUP_MULTIPLE:
        raise QuantizeError("group_size", f"{group_size} is not a multiple of {GROUP_MULTIPLE}")
    for name, num_features in features.items():
        if num_features % group_size:
            raise QuantizeError(
                "group_size",
                f"{group_size} does not divide {name}'s {num_features} input features",
            )
    is_symmetric = (
        spec.method == QuantizeMethod.GPTQ if spec.is_symmetric is None else spec.is_symmetric
    )
    return attrs.evolve(spec, group_size=group_size, is_symmetric=is_symmetric)


def check_calibration(config: ModelConfig, calibration: Calibration) -> None:
    if config.model_type not in INT4_MODEL_TYPES:
        supported = ", ".join(sorted(INT4_MODEL_TYPES))
        raise QuantizeError(
            "calibration", f"is read for the llama family ({supported}), not {config.model_type}"
        )
    if calibration.num_tokens < 2:
        raise QuantizeError("calibration_tokens", f"{calibration.num_tokens} is fewer than 2")
    if not calibration.text_path.is_file():
        raise QuantizeError("calibration", f"{calibration.text_path} is not a file")


def calibrated_rounding(spec: QuantizeSpec) -> Rounding[RoundedWeight]:
    """The GPTQ rounding ``spec`` (resolved) writes, for :func:`sequential_rounding`."""
    if spec.method == QuantizeMethod.FP8:
        return fp8_rounding(spec.fp8_layout)
    return int4_rounding(spec)


def fp8_rounding(layout: Fp8Layout) -> Rounding[Fp8Weight]:
    def fp8(_: str, weight: torch.Tensor, hessian: torch.Tensor) -> Fp8Weight:
        return Fp8Weight(*gptq_fp8(weight, hessian, layout), layout)

    return fp8


def int4_rounding(spec: QuantizeSpec) -> Rounding[Int4Levels]:
    assert spec.group_size is not None
    group_size, method = spec.group_size, Int4Method(str(spec.method))

    def int4(_: str, weight: torch.Tensor, hessian: torch.Tensor) -> Int4Levels:
        return gptq_int4(
            weight, hessian, group_size, method=method, is_symmetric=bool(spec.is_symmetric),
            is_act_order=spec.is_act_order,
        )  # fmt: skip

    return int4


def read_float_checkpoint(source: ModelSource) -> FloatCheckpoint:
    """``source``'s config and a stream of its float weights (a GGUF's dequantized to float32);
    :class:`QuantizeError` for a checkpoint that is quantized already."""
    if source.kind == "gguf":
        header = read_gguf_header(source.path)
        config = model_config_from_gguf_header(header)
        try:
            hf = hf_config(config)
        except ValueError as error:
            raise QuantizeError("model", f"{source.path}: {error}") from error
        weights = iter_gguf_weights(header, config)
        return FloatCheckpoint(
            config=config, hf=hf, weights=weights, source_bytes=source.path.stat().st_size
        )
    hf = json.loads((source.path / CONFIG_FILE).read_text())
    quantization = hf.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method", "unknown")
        raise QuantizeError("model", f"{source.path} is quantized already ({method})")
    names = checkpoint_tensor_names(source.path)
    return FloatCheckpoint(
        config=model_config_from_hf_file(source.path),
        hf=hf,
        weights=iter_safetensors(names),
        source_bytes=sum(path.stat().st_size for path in names),
    )


def quantize_checkpoint(source: ModelSource, out: str | Path, spec: QuantizeSpec) -> QuantizeReport:
    """Write ``source`` quantized as ``spec`` says to ``out`` (absent or empty), with its
    tokenizer files; :class:`QuantizeError` for what cannot be written."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise QuantizeError("out", f"{out} exists and is not an empty directory")
    checkpoint = read_float_checkpoint(source)
    spec = resolve_spec(checkpoint.config, spec)
    is_target = PROJECTION.fullmatch if spec.method != QuantizeMethod.FP8 else None
    counts = {True: 0, False: 0}
    kept: set[str] = set()

    def counted(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            if checkpoint.config.tie_word_embeddings and name == "lm_head.weight":
                continue
            quantized = is_fp8_target(name, tensor) if is_target is None else bool(is_target(name))
            counts[quantized] += tensor.numel()
            if not quantized:
                kept.add(name)
            yield name, tensor

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write(partial, source, checkpoint, counted(checkpoint.weights), spec)
        _write_tokenizer(source, partial)
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    quantized_bytes, kept_bytes = _tensor_bytes(out, kept)
    return QuantizeReport(
        out=out,
        spec=spec,
        file_bytes=tuple(
            (path.name, path.stat().st_size) for path in sorted(out.iterdir()) if path.is_file()
        ),
        num_quantized_params=counts[True],
        num_kept_params=counts[False],
        quantized_bytes=quantized_bytes,
        kept_bytes=kept_bytes,
        source_bytes=checkpoint.source_bytes,
    )


def _write(
    out: Path,
    source: ModelSource,
    checkpoint: FloatCheckpoint,
    weights: Iterable[tuple[str, torch.Tensor]],
    spec: QuantizeSpec,
) -> None:
    if spec.method == QuantizeMethod.FP8:
        write_fp8(
            out,
            checkpoint.hf,
            weights,
            spec.fp8_layout,
            float_dtype=spec.float_dtype,
            max_shard_bytes=spec.max_shard_bytes,
            rounded=_calibrated(source, spec, fp8_rounding(spec.fp8_layout)),
        )
        return
    assert spec.group_size is not None
    write_int4_checkpoint(
        out,
        checkpoint.config,
        weights,
        method=Int4Method(str(spec.method)),
        group_size=spec.group_size,
        is_symmetric=bool(spec.is_symmetric),
        hf=checkpoint.hf,
        max_shard_bytes=spec.max_shard_bytes,
        rounded=_calibrated(source, spec, int4_rounding(spec)),
        desc_act=spec.is_act_order,
    )


def _calibrated(
    source: ModelSource, spec: QuantizeSpec, rounding: Rounding[RoundedT]
) -> dict[str, RoundedT] | None:
    """Each projection's rounding in the sequential pass over ``spec``'s calibration (``None``
    without one)."""
    if spec.calibration is None:
        return None
    try:
        return sequential_rounding(source, spec.calibration, rounding)
    except (ValueError, UnicodeDecodeError) as error:
        raise QuantizeError("calibration", str(error)) from error


def _write_tokenizer(source: ModelSource, out: Path) -> None:
    """The source's tokenizer files: a directory's copied (everything but the checkpoint), a
    GGUF's written from its header (with its chat template)."""
    if source.kind == "dir":
        for item in source.path.iterdir():
            is_weights = item.suffix == ".safetensors" or item.name in CHECKPOINT_FILES
            if item.is_file() and not is_weights:
                shutil.copy(item, out / item.name)
        return
    fields = read_gguf_header(source.path).fields
    Tokenizer.from_gguf_fields(fields).save(out)
    template = fields.get(GGUF_CHAT_TEMPLATE_KEY)
    if template is not None:
        (out / CHAT_TEMPLATE_FILE).write_text(str(template), encoding="utf-8")


def _tensor_bytes(out: Path, kept: set[str]) -> tuple[int, int]:
    """Bytes of the written tensors, from the files' headers: those quantized (with their
    scales and zeros), those kept."""
    quantized_bytes = kept_bytes = 0
    for path in out.glob("*.safetensors"):
        with path.open("rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            if name in kept:
                kept_bytes += end - start
            else:
                quantized_bytes += end - start
    return quantized_bytes, kept_bytes
