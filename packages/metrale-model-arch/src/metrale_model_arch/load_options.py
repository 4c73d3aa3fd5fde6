"""``LoadOptions``: how a checkpoint becomes a model in memory, one value for every loader."""

from __future__ import annotations

import attrs
import torch

from metrale_model_arch.allocator import TensorAllocator, plain_allocator
from metrale_model_arch.loading.progress import ProgressObserver
from metrale_model_arch.parallel.shard import TensorShard
from metrale_model_arch.weight_format import Quantization


def _to_device(device: torch.device | str) -> torch.device:
    return torch.device(device)


def _to_quantization(quantization: Quantization | str) -> Quantization:
    return Quantization(quantization)


@attrs.frozen(kw_only=True)
class LoadOptions:
    """What :func:`~metrale_model_arch.load_model`, both loaders and
    :func:`~metrale_model_arch.build_model` are told beyond the checkpoint itself.

    ``dtype`` is the activations' and norms' (and the weights' when ``quantization`` is
    ``none``); ``int8`` stores the embeddings and projections as int8 per row, ``q4`` the
    projections as 4-bit blocks (:mod:`~metrale_model_arch.weight_format`). ``max_seq_len`` caps
    the context (default: the model's ``max_position_embeddings``). ``kernel_backend`` (``auto``,
    ``torch``, ``cupy``) runs the model's ops. ``shard``: load only this rank's part
    (:mod:`~metrale_model_arch.parallel`). ``without_head``: a model that only ever gives hidden
    states (an embedding model) has no head of its own (a GGUF keeps its head). ``text_only``:
    a checkpoint's vision tower (GLM-5.3's ``model.visual``) is not loaded. ``without_mtp``:
    nor are its multi-token-prediction layers (kept for MTP speculation only). Weights and
    tables are allocated through ``allocator`` (an allocation ledger, in the server);
    ``on_progress(done, total)`` hears of every checkpoint tensor loaded.
    """

    dtype: torch.dtype = torch.float32
    device: torch.device = attrs.field(default=torch.device("cpu"), converter=_to_device)
    max_seq_len: int | None = None
    quantization: Quantization = attrs.field(default=Quantization.NONE, converter=_to_quantization)
    kernel_backend: str = "auto"
    shard: TensorShard | None = None
    without_head: bool = False
    text_only: bool = False
    without_mtp: bool = False
    allocator: TensorAllocator = attrs.field(default=plain_allocator, eq=False, repr=False)
    on_progress: ProgressObserver | None = attrs.field(default=None, eq=False, repr=False)


DEFAULT_LOAD_OPTIONS = LoadOptions()
