"""How K/V attention layers store their cache (``--kv-cache-dtype``, vLLM's names; int8 ours).

``auto``: the serve dtype. ``int8``, ``fp8_e4m3`` (``fp8``) and ``fp8_e5m2``: one byte a value
and a float16 scale per (token, kv head), stored after the row's values
(:mod:`metrale_kernels.reference.kv_quantization`): a token costs ``head_dim + 2`` bytes a kv
head and role instead of ``head_dim x dtype bytes``, so the same budget holds ~2x the tokens of
bfloat16 and ~4x those of float32. Only K/V attention layers are quantized: an MLA latent (and
the DSA indexer beside it) is refused by name, a linear-attention layer has no per-token cache.
"""

from __future__ import annotations

import enum

import attrs

from metrale_model_arch.cache_spec import (
    FullAttentionSpec,
    LayerCacheSpec,
    MlaLatentSpec,
    SparseAttentionSpec,
    TensorDtype,
)

__all__ = ["KV_CACHE_DTYPE_NAMES", "KvCacheDtype", "quantized_kv_specs"]


class KvCacheDtype(enum.StrEnum):
    AUTO = "auto"
    INT8 = "int8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"

    @classmethod
    def parse(cls, name: str) -> KvCacheDtype:
        """``name`` as vLLM spells it (``fp8`` is ``fp8_e4m3``); ``ValueError`` names the flag."""
        if name == "fp8":
            return cls.FP8_E4M3
        try:
            return cls(name)
        except ValueError:
            raise ValueError(
                f"--kv-cache-dtype {name!r}: choose one of {', '.join(KV_CACHE_DTYPE_NAMES)}"
            ) from None

    @property
    def storage(self) -> TensorDtype:
        """The cache tensors' dtype (``model``: the serve dtype)."""
        return _STORAGE[self]


KV_CACHE_DTYPE_NAMES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
_STORAGE: dict[KvCacheDtype, TensorDtype] = {
    KvCacheDtype.AUTO: "model",
    KvCacheDtype.INT8: "int8",
    KvCacheDtype.FP8_E4M3: "float8_e4m3fn",
    KvCacheDtype.FP8_E5M2: "float8_e5m2",
}


def quantized_kv_specs(
    specs: tuple[LayerCacheSpec, ...], kv_dtype: KvCacheDtype, model_type: str
) -> tuple[LayerCacheSpec, ...]:
    """``specs`` with every K/V attention layer stored as ``kv_dtype``; ``ValueError`` (naming
    the flag) for a model whose MLA latent would have to be."""
    if kv_dtype is KvCacheDtype.AUTO:
        return specs
    if any(isinstance(spec, MlaLatentSpec | SparseAttentionSpec) for spec in specs):
        indexer = any(isinstance(spec, SparseAttentionSpec) for spec in specs)
        raise ValueError(
            f"--kv-cache-dtype {kv_dtype}: {model_type}'s MLA latent cache"
            f"{' (and its DSA indexer keys)' if indexer else ''} stays at the model dtype; only "
            "K/V attention layers are quantized (use --kv-cache-dtype auto)"
        )
    return tuple(
        attrs.evolve(spec, kv_dtype=kv_dtype.storage)
        if isinstance(spec, FullAttentionSpec)
        else spec
        for spec in specs
    )
