"""Checkpoint loaders: safetensors here, GGUF beside it; both feed :func:`build_model`."""

from metrale_model_arch.build import CheckpointError
from metrale_model_arch.loading.progress import (
    ProgressObserver,
    is_progress_enabled,
    load_progress,
)
from metrale_model_arch.loading.safetensors_loader import (
    checkpoint_tensor_names,
    iter_safetensors,
    load_safetensors_model,
)

__all__ = [
    "CheckpointError",
    "ProgressObserver",
    "checkpoint_tensor_names",
    "is_progress_enabled",
    "iter_safetensors",
    "load_progress",
    "load_safetensors_model",
]
