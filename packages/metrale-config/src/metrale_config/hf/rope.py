"""Rotary parameters from ``config.json``: transformers-5 ``rope_parameters`` or legacy fields."""

from __future__ import annotations

from metrale_config.fields import FieldReader
from metrale_config.rope import RopeScaling

_FACTOR_REQUIRED = frozenset({"linear", "dynamic", "llama3"})
_ORIGINAL_MAX_DEFAULTED = frozenset({"llama3", "yarn", "longrope"})


def parse_hf_rope(
    reader: FieldReader, *, default_theta: float, max_position_embeddings: int
) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)``; ``rope_scaling`` is ``None`` for plain (``default``) RoPE.

    Accepts ``rope_parameters`` (transformers 5: a dict holding ``rope_type`` and ``rope_theta``)
    and the legacy ``rope_theta`` + ``rope_scaling`` (``type`` or ``rope_type``); as in
    transformers, a non-empty ``rope_scaling`` wins over ``rope_parameters``. A ``rope_type`` this
    parser does not know (``yarn``, ``longrope``, ...) is kept, with its ``factor``: refusing it is
    the model family's decision.
    """
    top_theta = reader.number("rope_theta", default_theta)
    params = reader.child("rope_scaling")
    if params is None or not params.data:
        params = reader.child("rope_parameters")
    if params is None:
        return top_theta, None
    theta = params.number("rope_theta", top_theta)
    if params.is_set("rope_type"):
        rope_type = params.string("rope_type")
    else:
        rope_type = params.string("type", "default")
    if rope_type == "default":
        return theta, None
    if rope_type in _FACTOR_REQUIRED:
        factor = params.number("factor")
    elif rope_type == "longrope" and params.optional_number("factor") is None:
        # transformers: max_position_embeddings / original_max_position_embeddings.
        original = params.optional_integer("original_max_position_embeddings")
        factor = max_position_embeddings / original if original else 1.0
    else:
        factor = params.number("factor", 1.0)
    if rope_type in _FACTOR_REQUIRED and factor <= 0:
        raise params.error("factor", f"must be positive, got {factor}")
    original_default = max_position_embeddings if rope_type in _ORIGINAL_MAX_DEFAULTED else None
    if rope_type == "llama3":
        low_freq_factor: float | None = params.number("low_freq_factor")
        high_freq_factor: float | None = params.number("high_freq_factor")
    else:
        low_freq_factor = params.optional_number("low_freq_factor")
        high_freq_factor = params.optional_number("high_freq_factor")
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    if rope_type == "longrope":
        short_factor = _number_list(params, "short_factor")
        long_factor = _number_list(params, "long_factor")
    yarn = rope_type == "yarn"
    scaling = RopeScaling(
        rope_type=rope_type,
        short_factor=short_factor,
        long_factor=long_factor,
        attention_factor=params.optional_number("attention_factor"),
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position_embeddings=params.optional_integer(
            "original_max_position_embeddings", original_default
        ),
        beta_fast=params.optional_number("beta_fast") if yarn else None,
        beta_slow=params.optional_number("beta_slow") if yarn else None,
        truncate=params.boolean("truncate", True) if yarn else True,
        mscale=params.optional_number("mscale") if yarn else None,
        mscale_all_dim=params.optional_number("mscale_all_dim") if yarn else None,
    )
    return theta, scaling


def _number_list(reader: FieldReader, name: str) -> tuple[float, ...]:
    value = reader.data.get(name)
    if not isinstance(value, list) or not all(
        isinstance(item, int | float) and not isinstance(item, bool) for item in value
    ):
        raise reader.error(name, "must be a list of numbers")
    return tuple(float(item) for item in value)
