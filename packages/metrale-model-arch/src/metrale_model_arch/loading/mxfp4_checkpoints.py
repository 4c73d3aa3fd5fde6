"""Read gpt-oss's MXFP4 expert weights (``quant_method: mxfp4``), dequantized at load.

An expert projection ``P`` (``mlp.experts.gate_up_proj`` or ``down_proj``) of ``rows`` output
and ``cols`` input features is stored as ``P_blocks``, uint8 ``(experts, rows, cols // 32,
16)``: 32 FP4 (e2m1) values a block, two a byte, the low nibble first; and ``P_scales``, uint8
``(experts, rows, cols // 32)``: each block's power-of-two scale (e8m0, ``2 ** (s - 127)``).
The values are exact in bfloat16 and float32. Dequantized, ``P`` is transposed to
transformers' ``(experts, cols, rows)`` layout. Every other tensor (attention, router, biases,
embeddings, head) is stored in float and passes as it is.

Priced as the serve dtype's bytes (the plan counts dequantized weights): gpt-oss-120b in
bfloat16 holds 233.7 GB of weights, 3.6 times its checkpoint's 65.2 GB (4.25 bits an expert
weight, the rest bfloat16).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from metrale_model_arch.loading.errors import CheckpointError

MXFP4 = "mxfp4"
BLOCKS, SCALES = "_blocks", "_scales"
FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# e2m1: the sign is the top bit of the nibble.
FP4_VALUES = (*FP4_MAGNITUDES, *(-value for value in FP4_MAGNITUDES))
E8M0_BIAS = 127


def mxfp4_checkpoint_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``tensors`` with each ``P_blocks`` / ``P_scales`` pair, once both have arrived (from any
    file), dequantized to one float32 ``P``; every other tensor as it is. Raises
    :class:`CheckpointError` naming a half without its other half."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        suffix = name[-len(BLOCKS) :]
        if suffix not in (BLOCKS, SCALES):
            yield name, tensor
            continue
        prefix = name[: -len(suffix)]
        parts = pending.setdefault(prefix, {})
        parts[suffix] = tensor
        if len(parts) == 2:
            del pending[prefix]
            yield prefix, dequantize_mxfp4(prefix, parts[BLOCKS], parts[SCALES])
    if pending:
        lacking = [
            f"{prefix} lacks {prefix}{SCALES if BLOCKS in parts else BLOCKS}"
            for prefix, parts in sorted(pending.items())
        ]
        raise CheckpointError(f"{MXFP4}: {'; '.join(lacking)}")


def dequantize_mxfp4(prefix: str, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``(experts, rows, groups, 16)`` blocks and ``(experts, rows, groups)`` scales ->
    ``(experts, groups * 32, rows)`` float32."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise CheckpointError(f"{prefix}: MXFP4 blocks and scales must be uint8")
    if blocks.dim() != 4 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise CheckpointError(
            f"{prefix}: MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} "
            "must be (experts, rows, groups, 16) and (experts, rows, groups)"
        )
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    # (experts, rows, groups, 32): the low nibble of each byte, then the high one.
    nibbles = blocks.to(torch.int64)
    values = torch.stack((lut[nibbles & 0x0F], lut[nibbles >> 4]), dim=-1).flatten(-2)
    exponents = scales.to(torch.int32) - E8M0_BIAS
    dequantized = torch.ldexp(values, exponents[..., None]).flatten(-2)
    return dequantized.transpose(1, 2).contiguous()
