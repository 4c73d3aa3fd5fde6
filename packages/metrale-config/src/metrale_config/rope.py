"""Rotary embedding parameters as real configs declare them."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class RopeScaling:
    """One rotary scaling rule: ``rope_type`` is ``default``, ``linear``, ``dynamic`` or ``llama3``.

    ``factor`` applies to ``linear``, ``dynamic`` and ``llama3``; the ``*_freq_factor`` fields and
    ``original_max_position_embeddings`` to ``llama3`` (and ``dynamic``, which also reads the
    model's ``max_position_embeddings``). ``longrope`` (Phi-3) reads ``short_factor`` and
    ``long_factor`` (one per rotary frequency), ``original_max_position_embeddings`` and
    ``attention_factor`` (``None``: derived from ``factor`` as transformers does). ``yarn`` reads
    ``factor``, ``original_max_position_embeddings``, ``attention_factor``, the ramp's
    ``beta_fast`` / ``beta_slow`` (``None``: 32 and 1), ``truncate`` and DeepSeek's ``mscale`` /
    ``mscale_all_dim``. Parsers keep any other ``rope_type`` (GGUF's ``gguf_rope_freqs``) with its
    ``factor``, for the family to refuse.
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool = True
    mscale: float | None = None
    mscale_all_dim: float | None = None
