"""Checkpoint loaders (safetensors, GGUF), above the model families: the mapping types and
name tables the families declare live in ``families``; the loaders live in
``safetensors_loader`` and ``gguf_loader``. This package's root exports what the server reads
while a model loads (the progress observer) and the loaders' error."""

from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.progress import (
    ProgressObserver,
    is_progress_enabled,
    load_progress,
)

__all__ = [
    "CheckpointError",
    "ProgressObserver",
    "is_progress_enabled",
    "load_progress",
]
