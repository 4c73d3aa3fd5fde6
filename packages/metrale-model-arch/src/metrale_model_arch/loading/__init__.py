"""Checkpoint loaders (safetensors, GGUF) and the per-family mapping they share.

The loaders live in ``safetensors_loader`` and ``gguf_loader``; this package's root exports only
what the model families import (the mapping types), so that importing a family never imports a
loader.
"""

from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.mapping import CheckpointMapping, Skip, TensorTarget, same_names
from metrale_model_arch.loading.progress import (
    ProgressObserver,
    is_progress_enabled,
    load_progress,
)

__all__ = [
    "CheckpointError",
    "CheckpointMapping",
    "ProgressObserver",
    "Skip",
    "TensorTarget",
    "is_progress_enabled",
    "load_progress",
    "same_names",
]
