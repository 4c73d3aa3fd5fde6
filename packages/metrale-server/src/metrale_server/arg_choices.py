"""The values the engine's named arguments take (``--dtype``, ``--quantization``,
``--kv-cache-dtype``, ``--kernel-backend``, ``--task``): named here, below both ``EngineArgs`` and
``SpeculativeConfig``, and without importing torch, so ``met --help`` does not wait for it."""

from __future__ import annotations

DTYPE_NAMES = ("float32", "bfloat16", "float16")
# Not a ``--dtype`` choice: the Python API's dtype for exactness checks, where float32 rounding
# would hide an error (on the CPU with the torch kernel backend only).
EXACTNESS_DTYPE_NAME = "float64"
# ``metrale_model_arch.QUANTIZATION_NAMES`` and ``auto``.
QUANTIZATION_CHOICES = ("auto", "none", "int8", "q4", "fp8")
# ``metrale_model_arch.KV_CACHE_DTYPE_NAMES`` (vLLM's names; ``fp8`` is ``fp8_e4m3``).
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
# ``metrale_model_arch.SlidingWindowCache``: sliding-window layers' K/V in a ring per sequence,
# or in the KV pool as full attention's.
SLIDING_WINDOW_CACHE_CHOICES = ("ring", "full")
# ``metrale_kernels.BACKEND_NAMES``.
KERNEL_BACKEND_CHOICES = ("auto", "torch", "cpu", "cupy")
# What the served model does: ``auto`` detects it from the model's files
# (:func:`metrale_server.pooling.model_task.resolve_model_task`).
TASK_CHOICES = ("auto", "generate", "embed", "score")
