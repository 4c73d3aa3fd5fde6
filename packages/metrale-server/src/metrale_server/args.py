"""``EngineArgs``: the engine's shape (model, pool, batch limits), named as the CLI names them."""

from __future__ import annotations

import attrs

from metrale_config import read_bool_lever
from metrale_server.arg_choices import (
    KERNEL_BACKEND_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    QUANTIZATION_CHOICES,
    SLIDING_WINDOW_CACHE_CHOICES,
    TASK_CHOICES,
)
from metrale_server.speculative_config import SpeculativeConfig

CPU_KV_CACHE_DEFAULT_GIB = 4.0
DEFAULT_IMAGES_PER_PROMPT = 8
DEFAULT_BLOCK_SIZE = 16


@attrs.frozen(kw_only=True)
class EngineArgs:
    """Engine settings; ``None`` means "derive from the model" (or, for ``max_batch_size``,
    ``auto``: the slot count that admits the most full-length sequences).

    ``max_seq_len`` defaults to the model's context. The KV pool is what the memory plan
    leaves in ``gpu_memory_utilization`` of the device's memory, up to what ``max_batch_size``
    full-length sequences can use and, when set, to ``kv_cache_memory_gib`` (``None``: 4 GiB on
    the CPU, as vLLM's CPU backend, so a laptop keeps its RAM; no cap on CUDA);
    ``num_kv_blocks`` fixes it instead (it must still fit). The running set is limited by free
    KV blocks and ``max_batch_size`` (256, as vLLM's ``max_num_seqs``). Unless
    ``enforce_eager`` (default: the ``METRALE_ENFORCE_EAGER`` lever), a dense llama-family
    model on the CPU runs its layer steps compiled once a background compile finishes.
    ``speculative_config`` turns on n-gram speculative decoding (off by default).
    ``tensor_parallel_size`` above 1 splits the model over that many ranks
    (:mod:`metrale_server.engine.distributed`): workers started here, or by ``torchrun``.
    ``quantization`` ``auto`` keeps the checkpoint's format: ``q4`` for a Q4_1 GGUF or an
    AWQ/GPTQ int4 checkpoint (where the native cpu kernels run it), ``none`` otherwise;
    ``int8`` and ``q4`` of float weights are lossy and only ever asked for. ``dtype`` ``auto``
    is the checkpoint's own where the device computes it natively
    (:func:`metrale_server.devices.resolve_dtype`); ``float64``, not a ``--dtype`` choice, is
    for exactness checks (the CPU, ``kernel_backend`` ``torch``). ``kv_cache_dtype``: how K/V
    attention layers store their cache, ``auto`` (the serve dtype), ``int8``, ``fp8`` /
    ``fp8_e4m3`` or ``fp8_e5m2`` (one byte a value and a float16 scale a row:
    :mod:`metrale_model_arch.kv_cache_dtype`; lossy, only ever asked for).
    ``kernel_backend`` runs the model's ops: ``torch`` (the reference), ``cpu`` (native C++
    kernels, built on the machine in the background at the first start), ``cupy`` (CUDA
    kernels), ``auto`` (``cupy`` on CUDA where CuPy can run, ``cpu`` on a CPU with a C++
    compiler, else ``torch``).
    ``task``: ``generate`` (completions, chat), ``embed`` (``/v1/embeddings``), ``score``
    (``/v1/score``, ``/v1/rerank``: a causal-LM reranker's yes/no logits) or ``auto`` (an
    embedding model by its sentence-transformers files, else ``generate``).
    ``images_per_prompt``: the most images one request may carry, for a model with a vision
    tower the engine serves (vLLM's ``--limit-mm-per-prompt '{"image": N}'``); 0 serves text
    only and leaves the tower unloaded. ``encoder_cache_tokens``: image tokens of encoder
    output kept for reuse (``None``: the larger of ``max_batch_tokens`` and one image's most).
    ``sliding_window_cache``: ``ring`` (each sequence keeps only its window of a sliding-window
    layer's K/V, in a ring beside its state slot, where the model's family runs it and it saves
    memory; prefix caching is then off) or ``full`` (every token in the KV pool).
    """

    model: str | None = None
    dtype: str = "auto"
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"
    device: str = "auto"
    kernel_backend: str = "auto"
    # None: DEFAULT_BLOCK_SIZE, or the least multiple of a paged DSA indexer's pool above it
    # (:func:`metrale_server.memory.preflight.resolve_block_size`).
    block_size: int | None = None
    max_seq_len: int | None = None
    max_batch_size: int | None = 256
    max_batch_tokens: int = 2048
    num_kv_blocks: int | None = None
    kv_cache_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enforce_eager: bool = attrs.field(factory=lambda: read_bool_lever("METRALE_ENFORCE_EAGER"))
    seed: int = 0
    speculative_config: SpeculativeConfig | None = None
    tensor_parallel_size: int = 1
    task: str = "auto"
    images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT
    encoder_cache_tokens: int | None = None
    sliding_window_cache: str = "ring"

    def __attrs_post_init__(self) -> None:
        if self.task not in TASK_CHOICES:
            raise ValueError(f"task must be one of {', '.join(TASK_CHOICES)}, got {self.task!r}")
        if self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, "
                f"got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPE_CHOICES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.sliding_window_cache not in SLIDING_WINDOW_CACHE_CHOICES:
            raise ValueError(
                f"sliding_window_cache must be one of {', '.join(SLIDING_WINDOW_CACHE_CHOICES)}, "
                f"got {self.sliding_window_cache!r}"
            )
        if self.kernel_backend not in KERNEL_BACKEND_CHOICES:
            raise ValueError(
                f"kernel_backend must be one of {', '.join(KERNEL_BACKEND_CHOICES)}, "
                f"got {self.kernel_backend!r}"
            )
        for name in ("max_batch_tokens", "tensor_parallel_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.images_per_prompt < 0:
            raise ValueError(f"images_per_prompt must be >= 0, got {self.images_per_prompt}")
        for name in (
            "block_size",
            "max_seq_len",
            "num_kv_blocks",
            "max_batch_size",
            "encoder_cache_tokens",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.kv_cache_memory_gib is not None and not self.kv_cache_memory_gib > 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        if self.speculative_config is not None and self.tensor_parallel_size > 1:
            raise ValueError("speculative decoding does not run with tensor_parallel_size > 1 yet")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
