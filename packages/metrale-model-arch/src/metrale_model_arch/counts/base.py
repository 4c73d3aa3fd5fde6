"""What a parameter counter returns."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class ParamCounts:
    """Parameter counts by owner at the serve dtype, plus the layers' float32 parameters."""

    embeddings: int
    layers: int
    final_norm: int
    lm_head: int
    layers_fp32: int = 0
