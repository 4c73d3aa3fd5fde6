"""The loaders' error."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot become the model: unmapped, unwritten or misshapen tensors, or a
    file that cannot be read."""
