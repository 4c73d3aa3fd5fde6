"""``quantization_config`` of an FP8 e4m3 checkpoint -> :class:`Fp8Quantization`.

Accepted:

- ``quant_method: fp8`` (transformers' ``FineGrainedFP8Config``, vLLM's ``fp8``, DeepSeek-V3's
  and GLM's configs): ``fmt`` ``e4m3`` (absent means it), ``activation_scheme`` ``dynamic`` or
  ``static``, ``weight_block_size`` ``[rows, columns]`` (block scales ``weight_scale_inv``) or
  absent (one ``weight_scale`` per tensor); ``modules_to_not_convert`` / ``ignored_layers``
  name layers stored in float, which the checkpoint's own dtypes say again.
- ``quant_method: compressed-tensors`` with ``format`` ``float-quantized`` or
  ``naive-quantized``, every config group's ``weights`` 8-bit ``float``, symmetric, static,
  ``strategy`` ``tensor``, ``channel`` or ``block`` (its ``block_structure``); input
  activations of any kind (their ``input_scale`` tensors are not needed); ``ignore``d layers
  stored in float.

Every other variant of these two methods (e5m2, integer or 4-bit weights, packed formats, KV
cache or output scales) is refused naming the field and its value; other ``quant_method``
values are left to the loader, which refuses what it cannot read.
"""

from __future__ import annotations

from metrale_config.fields import FieldReader
from metrale_config.fp8_quantization import Fp8Granularity, Fp8Method, Fp8Quantization

FP8_FORMATS = ("e4m3",)
ACTIVATION_SCHEMES = ("dynamic", "static")
COMPRESSED_FORMATS = ("float-quantized", "naive-quantized")
COMPRESSED_STATUSES = ("compressed",)
WEIGHT_BITS = 8


def parse_fp8_quantization(reader: FieldReader) -> Fp8Quantization | None:
    """The FP8 config under ``quantization_config``; None for no config or another
    ``quant_method``. Raises ``ConfigError`` naming the field for a variant not read here."""
    quantization = reader.child("quantization_config")
    if quantization is None:
        return None
    method = (quantization.optional_string("quant_method") or "").lower()
    if method == Fp8Method.FP8:
        return _parse_fp8(quantization)
    if method == Fp8Method.COMPRESSED_TENSORS:
        return _parse_compressed_tensors(quantization)
    return None


def _parse_fp8(quantization: FieldReader) -> Fp8Quantization:
    fmt = quantization.optional_string("fmt") or "e4m3"
    if fmt.lower() not in FP8_FORMATS:
        raise quantization.error("fmt", f"is {fmt!r}: only e4m3 fp8 weights are read")
    scheme = quantization.optional_string("activation_scheme") or "dynamic"
    if scheme.lower() not in ACTIVATION_SCHEMES:
        raise quantization.error(
            "activation_scheme", f"is {scheme!r} (known: {', '.join(ACTIVATION_SCHEMES)})"
        )
    block_size = _block_size(quantization, "weight_block_size")
    return Fp8Quantization(
        method=Fp8Method.FP8,
        granularities=(Fp8Granularity.TENSOR if block_size is None else Fp8Granularity.BLOCK,),
        block_size=block_size,
        has_static_activations=scheme.lower() == "static",
    )


def _parse_compressed_tensors(quantization: FieldReader) -> Fp8Quantization:
    _check_format(quantization)
    status = quantization.optional_string("quantization_status") or "compressed"
    if status not in COMPRESSED_STATUSES:
        raise quantization.error(
            "quantization_status", f"is {status!r}: only compressed checkpoints are read"
        )
    if quantization.is_set("kv_cache_scheme"):
        raise quantization.error("kv_cache_scheme", "is set: fp8 KV cache scales are not read")
    groups = quantization.child("config_groups")
    if groups is None or not groups.data:
        raise quantization.error("config_groups", "is missing: no quantized layers declared")
    granularities: set[Fp8Granularity] = set()
    block_sizes: set[tuple[int, int]] = set()
    has_static_activations = False
    for name in groups.data:
        group = groups.child(name)
        if group is None:
            raise groups.error(name, "must be an object")
        _check_format(group)
        if group.is_set("output_activations"):
            raise group.error("output_activations", "is set: output scales are not read")
        weights = group.child("weights")
        if weights is None:
            raise group.error("weights", "is missing: only weight quantization is read")
        granularity, block_size = _weight_scheme(weights)
        granularities.add(granularity)
        if block_size is not None:
            block_sizes.add(block_size)
        activations = group.child("input_activations")
        if activations is not None and not activations.boolean("dynamic", False):
            has_static_activations = True
    if len(block_sizes) > 1:
        raise groups.error(
            "*.weights.block_structure", f"differs between groups: {sorted(block_sizes)}"
        )
    return Fp8Quantization(
        method=Fp8Method.COMPRESSED_TENSORS,
        granularities=tuple(g for g in Fp8Granularity if g in granularities),
        block_size=next(iter(block_sizes), None),
        has_static_activations=has_static_activations,
    )


def _check_format(reader: FieldReader) -> None:
    fmt = reader.optional_string("format")
    if fmt is not None and fmt not in COMPRESSED_FORMATS:
        raise reader.error(
            "format",
            f"is {fmt!r}: only fp8 weights are read (supported: {', '.join(COMPRESSED_FORMATS)})",
        )


def _weight_scheme(weights: FieldReader) -> tuple[Fp8Granularity, tuple[int, int] | None]:
    kind = weights.string("type", "int")
    if kind != "float":
        raise weights.error("type", f"is {kind!r}: only float (fp8) weights are read")
    bits = weights.integer("num_bits", WEIGHT_BITS)
    if bits != WEIGHT_BITS:
        raise weights.error("num_bits", f"is {bits}: only 8-bit float weights are read")
    if not weights.boolean("symmetric", True):
        raise weights.error("symmetric", "is false: only symmetric fp8 weights are read")
    if weights.is_set("dynamic") and weights.data["dynamic"] is not False:
        raise weights.error("dynamic", "is not false: weights must carry their scales")
    strategy = weights.string("strategy", "tensor")
    known = ", ".join(g.value for g in Fp8Granularity)
    if strategy not in tuple(Fp8Granularity):
        raise weights.error("strategy", f"is {strategy!r}: not read (supported: {known})")
    granularity = Fp8Granularity(strategy)
    if granularity != Fp8Granularity.BLOCK:
        return granularity, None
    block_size = _block_size(weights, "block_structure")
    if block_size is None:
        raise weights.error("block_structure", "is missing: the block strategy needs it")
    return granularity, block_size


def _block_size(reader: FieldReader, field: str) -> tuple[int, int] | None:
    sizes = reader.optional_integer_list(field)
    if sizes is None:
        return None
    if len(sizes) != 2 or min(sizes) <= 0:
        raise reader.error(field, f"must be two positive integers [rows, columns], got {sizes}")
    return sizes[0], sizes[1]
