"""Field reads every ``config.json`` family shares: dtype, quantization, MTP, layer type names."""

from __future__ import annotations

from collections.abc import Mapping

from metrale_config.fields import FieldReader
from metrale_config.layer_types import LayerType
from metrale_config.model_config import MtpConfig

# A layer_types entry spelled as one of ours means that type.
OWN_LAYER_TYPE_NAMES: Mapping[str, LayerType] = {kind.value: kind for kind in LayerType}


def parse_dtype(reader: FieldReader) -> str | None:
    """``dtype`` (transformers 5) or ``torch_dtype`` (older saves)."""
    if reader.is_set("dtype"):
        return reader.string("dtype")
    return reader.optional_string("torch_dtype")


def parse_quantization_method(reader: FieldReader) -> str | None:
    quantization = reader.child("quantization_config")
    return None if quantization is None else quantization.optional_string("quant_method")


def parse_eos_token_ids(reader: FieldReader, default: int | None) -> tuple[int, ...]:
    if not reader.has("eos_token_id"):
        return () if default is None else (default,)
    return reader.optional_integer_list("eos_token_id") or ()


def map_layer_type(
    reader: FieldReader, field: str, kind: str, names: Mapping[str, LayerType]
) -> LayerType:
    """``names[kind]``, or a ``ConfigError`` naming ``field`` and the known names."""
    mapped = names.get(kind)
    if mapped is None:
        known = ", ".join(sorted(names))
        raise reader.error(field, f"has unknown layer type '{kind}' (known: {known})")
    return mapped


def parse_mtp(
    reader: FieldReader, layer_type_names: Mapping[str, LayerType] = OWN_LAYER_TYPE_NAMES
) -> MtpConfig | None:
    """``num_nextn_predict_layers`` / ``num_mtp_layers`` (+ ``mtp_layer_types``); None when 0."""
    name = (
        "num_nextn_predict_layers"
        if reader.is_set("num_nextn_predict_layers")
        else "num_mtp_layers"
    )
    num_layers = reader.optional_integer(name) or 0
    if num_layers < 0:
        raise reader.error(name, f"must not be negative, got {num_layers}")
    if num_layers == 0:
        return None
    raw_types = reader.optional_string_list("mtp_layer_types") or ()
    layer_types = tuple(
        map_layer_type(reader, "mtp_layer_types", kind, layer_type_names) for kind in raw_types
    )
    return MtpConfig(num_layers=num_layers, layer_types=layer_types)
