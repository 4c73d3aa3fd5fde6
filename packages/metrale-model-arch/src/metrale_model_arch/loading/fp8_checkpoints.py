"""Read an FP8 e4m3 safetensors checkpoint's quantized weights, dequantized to float32.

A quantized linear layer ``P`` (``out`` output and ``in`` input features) is stored as
``P.weight``, float8_e4m3fn ``(out, in)``, beside a float scale (float32, or the model's
float16 or bfloat16 in compressed-tensors) whose values multiply it: ``w = q * s``, with

- per tensor: one ``s``, of shape ``()``, ``(1,)`` or ``(1, 1)``;
- per channel: ``s`` ``(out, 1)``, row ``n`` times ``s[n]``;
- per block of ``R x C`` (``weight_block_size`` / ``block_structure``): ``s``
  ``(ceil(out / R), ceil(in / C))``, ``w[n, k] = q[n, k] * s[n // R, k // C]`` (the last row and
  column of blocks may be partial).

transformers' and vLLM's ``fp8`` name the block scales ``P.weight_scale_inv`` (DeepSeek-V3's
name: a multiplier despite it) and the per-tensor one ``P.weight_scale``; compressed-tensors
names each ``P.weight_scale``. Static activation scales (``P.input_scale``) are dropped, and
so are compressed-tensors' zero points (``P.weight_zero_point``), which must be 0 (symmetric).
Layers kept in float (``modules_to_not_convert``, ``ignore``) and every other tensor are stored
as in a float checkpoint and pass as they are. Its padded block layout
(``weight_shape_original``) is not read: the padded weight's shape is refused by the model.

With ``keep_fp8`` (``--quantization fp8``), a weight per tensor or per channel passes as
stored instead (:class:`~metrale_model_arch.fp8_rows.Fp8Rows`: its bytes, its scale as float32
per row); one per block is still dequantized (the fp8 model quantizes it per channel again).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from metrale_config import Fp8Granularity, Fp8Quantization, ModelConfig
from metrale_model_arch.fp8_rows import Fp8Rows, fp8_rows_of
from metrale_model_arch.loading.errors import CheckpointError

FP8_DTYPE = torch.float8_e4m3fn
OTHER_FLOAT8_DTYPES = (torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DROPPED_PARTS = frozenset({"input_scale", "input_zero_point"})
ZERO_POINT = "weight_zero_point"


def fp8_checkpoint_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], config: ModelConfig, *, keep_fp8: bool = False
) -> Iterator[tuple[str, torch.Tensor | Fp8Rows]]:
    """``tensors`` with each fp8 weight, once its scale has arrived too (from any file),
    dequantized to one float32 ``<layer>.weight`` (with ``keep_fp8``, kept as ``Fp8Rows`` unless
    scaled by block); every other tensor as it is.

    NOTE: one dequantized weight exists at a time (the model copies it into its own storage
    before the next is read); an fp8 weight or scale waits, as stored, for its other half.
    Raises :class:`CheckpointError` naming a weight without its scale, or misshapen parts."""
    fp8 = config.fp8_quantization
    assert fp8 is not None
    scale_part = fp8.scale_name
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, part = name.rpartition(".")
        if part in DROPPED_PARTS:
            continue
        if part == ZERO_POINT:
            if bool(tensor.any()):
                raise CheckpointError(f"{name}: non-zero zero points (asymmetric) are not read")
            continue
        is_fp8_weight = part == "weight" and tensor.dtype == FP8_DTYPE
        if not is_fp8_weight and part != scale_part:
            yield name, _refuse_float8(name, tensor)
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if parts.keys() >= {"weight", scale_part}:
            parts = pending.pop(prefix)
            weight, scale = parts["weight"], parts[scale_part]
            if keep_fp8 and _is_per_row(prefix, weight, scale, fp8):
                yield f"{prefix}.weight", fp8_rows_of(weight, scale)
            else:
                yield f"{prefix}.weight", dequantize_fp8(prefix, weight, scale, fp8)
    if pending:
        lacking = [
            f"{prefix} lacks {'its fp8 weight' if 'weight' not in parts else scale_part}"
            for prefix, parts in sorted(pending.items())
        ]
        raise CheckpointError(f"{fp8.describe()}: {'; '.join(lacking)}")


def dequantize_fp8(
    prefix: str, weight: torch.Tensor, scale: torch.Tensor, fp8: Fp8Quantization
) -> torch.Tensor:
    """``weight * scale`` in float32, the scale broadcast as its shape says (see the module)."""
    _check_parts(prefix, weight, scale, fp8)
    granularity = _granularity(prefix, tuple(weight.shape), tuple(scale.shape), fp8)
    dequantized = weight.to(torch.float32)
    scale = scale.to(torch.float32)
    if granularity == Fp8Granularity.TENSOR:
        return dequantized.mul_(scale.reshape(()))
    if granularity == Fp8Granularity.CHANNEL:
        return dequantized.mul_(scale)
    assert fp8.block_size is not None
    rows, cols = fp8.block_size
    by_column = scale.repeat_interleave(cols, dim=1)[:, : weight.shape[1]]
    for block_row, row_scales in enumerate(by_column):
        dequantized[block_row * rows : (block_row + 1) * rows].mul_(row_scales)
    return dequantized


def _is_per_row(
    prefix: str, weight: torch.Tensor, scale: torch.Tensor, fp8: Fp8Quantization
) -> bool:
    """Whether ``scale`` scales whole rows (per tensor or per channel), checked as
    :func:`dequantize_fp8` checks it."""
    _check_parts(prefix, weight, scale, fp8)
    granularity = _granularity(prefix, tuple(weight.shape), tuple(scale.shape), fp8)
    return granularity != Fp8Granularity.BLOCK


def _check_parts(
    prefix: str, weight: torch.Tensor, scale: torch.Tensor, fp8: Fp8Quantization
) -> None:
    if weight.dtype != FP8_DTYPE or weight.dim() != 2:
        raise CheckpointError(
            f"{prefix}.weight: must be a 2-d float8_e4m3fn tensor beside its scale, got "
            f"{weight.dtype} {tuple(weight.shape)}"
        )
    if scale.dtype not in SCALE_DTYPES:
        raise CheckpointError(f"{prefix}.{fp8.scale_name}: must be float, got {scale.dtype}")


def _granularity(
    prefix: str, weight: tuple[int, ...], scale: tuple[int, ...], fp8: Fp8Quantization
) -> Fp8Granularity:
    """The declared granularity ``scale``'s shape is, or a :class:`CheckpointError`."""
    rows, cols = weight
    expected: dict[Fp8Granularity, tuple[tuple[int, ...], ...]] = {
        Fp8Granularity.TENSOR: ((), (1,), (1, 1)),
        Fp8Granularity.CHANNEL: ((rows, 1),),
    }
    if fp8.block_size is not None:
        block_rows, block_cols = fp8.block_size
        expected[Fp8Granularity.BLOCK] = ((-(-rows // block_rows), -(-cols // block_cols)),)
    for granularity in fp8.granularities:
        if scale in expected[granularity]:
            return granularity
    shapes = " or ".join(str(shape) for g in fp8.granularities for shape in expected[g][:1])
    raise CheckpointError(
        f"{prefix}.{fp8.scale_name}: shape {scale}, {fp8.describe()} with weight {weight} means "
        f"{shapes}"
    )


def _refuse_float8(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, unless it is float8 where only float is read."""
    if tensor.dtype == FP8_DTYPE:
        raise CheckpointError(
            f"{name}: float8_e4m3fn, but only a linear layer's weight (beside its scale) is "
            "read as fp8"
        )
    if tensor.dtype in OTHER_FLOAT8_DTYPES:
        raise CheckpointError(f"{name}: {tensor.dtype} is not read (only float8_e4m3fn)")
    return tensor
