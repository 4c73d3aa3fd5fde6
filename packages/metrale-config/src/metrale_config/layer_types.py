"""``LayerType``: the token mixer of a decoder layer, spelled as HF's ``layer_types`` does."""

from __future__ import annotations

import enum
from collections.abc import Iterable


class LayerType(enum.StrEnum):
    """One entry of ``ModelConfig.layer_types``; a ``str``, equal to its HF spelling."""

    FULL_ATTENTION = "full_attention"
    SLIDING_ATTENTION = "sliding_attention"
    LINEAR_ATTENTION = "linear_attention"
    # DeepSeek sparse attention (an MLA layer with an indexer), glm5_next's "indexed_attention".
    SPARSE_ATTENTION = "sparse_attention"


FULL_ATTENTION = LayerType.FULL_ATTENTION
SLIDING_ATTENTION = LayerType.SLIDING_ATTENTION
LINEAR_ATTENTION = LayerType.LINEAR_ATTENTION
SPARSE_ATTENTION = LayerType.SPARSE_ATTENTION


def to_layer_types(kinds: Iterable[str]) -> tuple[LayerType, ...]:
    """HF spellings → members; ``ValueError`` names an unknown one."""
    return tuple(LayerType(kind) for kind in kinds)
