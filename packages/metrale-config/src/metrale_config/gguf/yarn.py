"""YaRN's keys in GGUF metadata, beyond the scaling type, factor and original context that
every architecture reads: the ramp's betas and the attention factor (``TextModel`` writes each
when the checkpoint sets it). An extrapolation factor other than 1 is refused: no family here
blends by another amount."""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.rope import RopeScaling


def with_yarn_keys(
    scaling: RopeScaling | None, reader: FieldReader, arch: str
) -> RopeScaling | None:
    """``scaling`` with ``arch``'s YaRN keys when it is YaRN; else unchanged."""
    if scaling is None or scaling.rope_type != "yarn":
        return scaling
    prefix = f"{arch}.rope.scaling"
    ext_factor = reader.number(f"{prefix}.yarn_ext_factor", 1.0)
    if ext_factor != 1.0:
        raise reader.error(f"{prefix}.yarn_ext_factor", f"must be 1.0, got {ext_factor}")
    return attrs.evolve(
        scaling,
        beta_fast=reader.optional_number(f"{prefix}.yarn_beta_fast"),
        beta_slow=reader.optional_number(f"{prefix}.yarn_beta_slow"),
        attention_factor=reader.optional_number(f"{prefix}.yarn_attn_factor"),
    )
