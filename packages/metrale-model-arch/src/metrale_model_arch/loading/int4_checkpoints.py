"""Read an AWQ or GPTQ int4 safetensors checkpoint's projections as :class:`Int4Blocks`.

A quantized projection ``P`` (``out`` output and ``in`` input features, groups of ``G`` input
features, ``groups = in / G``; GPTQ's ``group_size: -1`` is one group, ``G = in``) is stored as
``P.qweight``, ``P.qzeros``, ``P.scales`` (and ``P.g_idx`` for GPTQ) in place of ``P.weight``;
every other tensor (embeddings, norms, the head, biases) is stored as in a float checkpoint. A
nibble ``i`` of an int32 is bits ``4i .. 4i + 3`` (``(v >> 4i) & 15``). The weight is
``w[n, k] = (q[n, k] - z[n, g]) * s[n, g]`` (``n`` output, ``k`` input feature, ``g`` its
group), float16 ``s``.

AWQ, ``version: gemm`` (AutoAWQ's ``WQLinear_GEMM``, transformers' and vLLM's ``awq``):

- ``qweight`` int32 ``(in, out / 8)``: packed along the output features, in AWQ's interleaved
  order: nibble ``i`` of ``qweight[k, c]`` is ``q[8c + ORDER[i], k]``, ``ORDER = (0, 2, 4, 6,
  1, 3, 5, 7)`` (so output ``8c + j`` is nibble ``REVERSE[j]``, ``REVERSE = (0, 4, 1, 5, 2, 6,
  3, 7)``);
- ``qzeros`` int32 ``(groups, out / 8)``: ``z`` packed the same way, ``z`` as stored (0..15);
- ``scales`` float16 ``(groups, out)``; input feature ``k``'s group is ``k // G``.

GPTQ, ``checkpoint_format: gptq`` (v1; AutoGPTQ's and GPTQModel's ``QuantLinear``,
transformers' and vLLM's ``gptq``):

- ``qweight`` int32 ``(in / 8, out)``: packed along the input features in order: nibble ``i``
  of ``qweight[r, n]`` is ``q[n, 8r + i]``;
- ``qzeros`` int32 ``(groups, out / 8)``: packed along the output features in order (nibble
  ``i`` of ``qzeros[g, c]`` is output ``8c + i``), holding ``z - 1`` (v1's "zeros minus one":
  ``z = nibble + 1``, so 1..16; symmetric checkpoints store 7 for ``z = 8``);
- ``scales`` float16 ``(groups, out)``;
- ``g_idx`` int32 ``(in,)``: input feature ``k``'s group. Without ``desc_act`` it must be
  ``k // G``; with it any assignment (act-order), the columns then being sorted by group for
  the q4 form (:mod:`~metrale_model_arch.families.int4_layers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from metrale_config import Int4Method, Int4Quantization, ModelConfig
from metrale_model_arch.int4_blocks import Int4Blocks
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.q4_1_blocks import Q4_1Blocks

PACK = 8  # 4-bit values per int32
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
AWQ_PARTS = frozenset({"qweight", "qzeros", "scales"})
GPTQ_PARTS = AWQ_PARTS | {"g_idx"}
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def int4_checkpoint_tensors(
    tensors: Iterable[tuple[str, torch.Tensor]], config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor | Q4_1Blocks]]:
    """``tensors`` with each quantized projection's parts, once all have arrived (from any
    file), as one ``<projection>.weight`` :class:`Int4Blocks`; every other tensor as it is.
    Raises :class:`CheckpointError` naming a projection whose parts are missing or misshapen."""
    int4 = config.int4_quantization
    assert int4 is not None
    parts_needed = AWQ_PARTS if int4.method == Int4Method.AWQ else GPTQ_PARTS
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, part = name.rpartition(".")
        if part not in GPTQ_PARTS:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if parts.keys() >= parts_needed:
            yield f"{prefix}.weight", read_int4_projection(prefix, pending.pop(prefix), int4)
    if pending:
        lacking = [
            f"{prefix} lacks {', '.join(sorted(parts_needed - parts.keys()))}"
            for prefix, parts in sorted(pending.items())
        ]
        raise CheckpointError(f"{int4.method} checkpoint: {'; '.join(lacking)}")


def read_int4_projection(
    prefix: str, parts: dict[str, torch.Tensor], int4: Int4Quantization
) -> Int4Blocks:
    """One projection's ``qweight``/``qzeros``/``scales`` (/``g_idx``) as :class:`Int4Blocks`."""
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    for part in ("qweight", "qzeros"):
        if parts[part].dtype != torch.int32 or parts[part].dim() != 2:
            raise CheckpointError(f"{prefix}.{part}: must be a 2-d int32 tensor")
    if scales.dtype != torch.float16 or scales.dim() != 2:
        raise CheckpointError(
            f"{prefix}.scales: must be a 2-d float16 tensor, got {scales.dtype} "
            f"{tuple(scales.shape)}"
        )
    if int4.method == Int4Method.AWQ:
        cols, rows = qweight.shape[0], qweight.shape[1] * PACK
    else:
        cols, rows = qweight.shape[0] * PACK, qweight.shape[1]
    group = int4.group_size or cols
    if cols % group:
        raise CheckpointError(f"{prefix}: {cols} input features are not whole groups of {group}")
    groups = cols // group
    expected = {"qzeros": (groups, rows // PACK), "scales": (groups, rows)}
    for part, shape in expected.items():
        if tuple(parts[part].shape) != shape:
            raise CheckpointError(
                f"{prefix}.{part}: shape {tuple(parts[part].shape)}, {int4.describe()} with "
                f"qweight {tuple(qweight.shape)} means {shape}"
            )
    if int4.method == Int4Method.AWQ:
        values = _unpack_awq(qweight).t()
        zeros = _unpack_awq(qzeros).t()
        group_of = torch.arange(cols) // group
        input_order = None
    else:
        values = _nibbles(qweight.t()).reshape(rows, cols)
        zeros = _nibbles(qzeros).reshape(groups, rows).t() + 1
        group_of, input_order = _gptq_groups(prefix, parts["g_idx"], int4, cols, group)
    try:
        return Int4Blocks.from_levels(
            values.to(torch.uint8).contiguous(),
            zeros.to(torch.int16).contiguous(),
            scales.t().contiguous(),
            group_of,
            input_order,
        )
    except ValueError as error:
        raise CheckpointError(f"{prefix}: {error}") from None


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``(..., c)`` -> ``(..., c, 8)``, nibble ``i`` at ``[..., i]``."""
    return (packed.unsqueeze(-1) >> _SHIFTS) & 15


def _unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AWQ's int32 ``(r, c)`` -> ``(r, 8c)`` values, output features in order."""
    rows = packed.shape[0]
    return _nibbles(packed)[:, :, list(AWQ_REVERSE_ORDER)].reshape(rows, -1)


def _gptq_groups(
    prefix: str, g_idx: torch.Tensor, int4: Int4Quantization, cols: int, group: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if tuple(g_idx.shape) != (cols,) or g_idx.dtype not in (torch.int32, torch.int64):
        raise CheckpointError(f"{prefix}.g_idx: must be {cols} integers, one per input feature")
    group_of = g_idx.to(torch.int64)
    in_order = torch.arange(cols) // group
    if not int4.desc_act:
        if not torch.equal(group_of, in_order):
            raise CheckpointError(
                f"{prefix}.g_idx: not in order (k // {group}) while desc_act is false"
            )
        return group_of, None
    if bool((group_of < 0).any()) or bool((group_of >= cols // group).any()):
        raise CheckpointError(f"{prefix}.g_idx: groups outside 0 .. {cols // group - 1}")
    return group_of, torch.sort(group_of, stable=True).indices
