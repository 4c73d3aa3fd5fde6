"""``quantization_config`` of an AWQ or GPTQ checkpoint -> :class:`Int4Quantization`.

Accepted: ``quant_method: awq`` with ``bits: 4``, ``zero_point: true`` and ``version: gemm``
(AutoAWQ's ``WQLinear_GEMM`` packing); ``quant_method: gptq`` with ``bits: 4``, any ``sym``
and ``desc_act``, and ``checkpoint_format: gptq`` (the v1 "zeros minus one" layout; absent
means it). Every other variant of these two methods is refused naming the field and its value;
other ``quant_method`` values are left to the loader, which refuses what it cannot read.
"""

from __future__ import annotations

from metrale_config.fields import FieldReader
from metrale_config.int4_quantization import Int4Method, Int4Quantization

SUPPORTED_BITS = 4
AWQ_VERSIONS = ("gemm",)
GPTQ_CHECKPOINT_FORMATS = ("gptq",)


def parse_int4_quantization(reader: FieldReader) -> Int4Quantization | None:
    """The AWQ/GPTQ int4 config under ``quantization_config``; None for no config or another
    ``quant_method``. Raises ``ConfigError`` naming the field for a variant not read here."""
    quantization = reader.child("quantization_config")
    if quantization is None:
        return None
    method = (quantization.optional_string("quant_method") or "").lower()
    if method not in (Int4Method.AWQ, Int4Method.GPTQ):
        return None
    bits = quantization.integer("bits", quantization.integer("w_bit", SUPPORTED_BITS))
    if bits != SUPPORTED_BITS:
        field = "bits" if quantization.has("bits") else "w_bit"
        raise quantization.error(field, f"is {bits}: only 4-bit {method} checkpoints are read")
    group_size = _group_size(quantization)
    if method == Int4Method.AWQ:
        version = quantization.string("version", "gemm")
        if version.lower() not in AWQ_VERSIONS:
            raise quantization.error(
                "version",
                f"is {version!r}: only AWQ's GEMM packing is read (supported: "
                f"{', '.join(AWQ_VERSIONS)})",
            )
        if not quantization.boolean("zero_point", True):
            raise quantization.error("zero_point", "is false: only AWQ with zero points is read")
        return Int4Quantization(method=Int4Method.AWQ, group_size=group_size)
    checkpoint_format = quantization.string("checkpoint_format", "gptq")
    if checkpoint_format.lower() not in GPTQ_CHECKPOINT_FORMATS:
        raise quantization.error(
            "checkpoint_format",
            f"is {checkpoint_format!r}: only the gptq (v1) layout is read (supported: "
            f"{', '.join(GPTQ_CHECKPOINT_FORMATS)})",
        )
    if quantization.boolean("is_marlin_format", False):
        raise quantization.error("is_marlin_format", "is true: Marlin-packed GPTQ is not read")
    return Int4Quantization(
        method=Int4Method.GPTQ,
        group_size=group_size,
        is_symmetric=quantization.boolean("sym", True),
        desc_act=quantization.boolean("desc_act", False),
    )


def _group_size(quantization: FieldReader) -> int | None:
    field = "group_size" if quantization.has("group_size") else "q_group_size"
    group_size = quantization.integer(field, 128)
    if group_size == -1:
        return None
    if group_size <= 0:
        raise quantization.error(field, f"must be positive or -1, got {group_size}")
    return group_size
