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
    factor = (
        params.number("factor") if rope_type in _FACTOR_REQUIRED else params.number("factor", 1.0)
    )
    if rope_type in _FACTOR_REQUIRED and factor <= 0:
        raise params.error("factor", f"must be positive, got {factor}")
    original_default = max_position_embeddings if rope_type in _ORIGINAL_MAX_DEFAULTED else None
    if rope_type == "llama3":
        low_freq_factor: float | None = params.number("low_freq_factor")
        high_freq_factor: float | None = params.number("high_freq_factor")
    else:
        low_freq_factor = params.optional_number("low_freq_factor")
        high_freq_factor = params.optional_number("high_freq_factor")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_max_position_embeddings=params.optional_integer(
            "original_max_position_embeddings", original_default
        ),
    )
    return theta, scaling
