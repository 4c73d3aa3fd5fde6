"""The CUDA C kernel sources shipped with the package, and the exact NVRTC options they are
compiled with at run time (``met kernels check`` compiles them with the same options)."""

from __future__ import annotations

from importlib import resources

import attrs

DTYPE_SUFFIXES = ("f32", "f16", "bf16")
# Quantized K/V caches (``reference.kv_quantization``): int8, fp8 e4m3 and e5m2 rows. A kernel
# over one is named ``<base>_<format>_<dtype>``, ``dtype`` the suffix of its float operands.
KV_FORMAT_SUFFIXES = ("i8", "e4m3", "e5m2")
NVRTC_OPTIONS = ("-std=c++17",)
# Prepended to every source: element types and conversions (kernels include no header).
PRELUDE = "common.cuh"


@attrs.frozen(kw_only=True)
class KernelSource:
    """One ``kernels/<name>.cu`` file and the ``extern "C"`` kernels it must define."""

    name: str
    functions: tuple[str, ...]
    headers: tuple[str, ...] = ()  # ``kernels/`` files included after the prelude, in order

    @property
    def file_name(self) -> str:
        return f"{self.name}.cu"


def _per_dtype(*bases: str) -> tuple[str, ...]:
    return tuple(f"{base}_{suffix}" for base in bases for suffix in DTYPE_SUFFIXES)


def _per_kv_format(*bases: str) -> tuple[str, ...]:
    return tuple(
        f"{base}_{kv}_{suffix}"
        for base in bases
        for kv in KV_FORMAT_SUFFIXES
        for suffix in DTYPE_SUFFIXES
    )


KERNEL_SOURCES = (
    KernelSource(name="norms", functions=_per_dtype("rms_norm", "add_rms_norm")),
    KernelSource(name="activation", functions=_per_dtype("silu_and_mul")),
    KernelSource(name="rotary", functions=_per_dtype("rotary")),
    KernelSource(
        name="kv_write",
        functions=_per_dtype("write_kv") + _per_kv_format("write_kv"),
        headers=("kv_quantization.cuh",),
    ),
    KernelSource(
        name="paged_attention",
        functions=_per_dtype("paged_attention_partial", "paged_attention_combine")
        + _per_kv_format("paged_attention_partial"),
        headers=("kv_quantization.cuh",),
    ),
    KernelSource(name="moe_routing", functions=_per_dtype("softmax_topk", "grouped_sigmoid_topk")),
    KernelSource(name="dsa", functions=_per_dtype("sparse_latent_attention")),
    KernelSource(name="dsa_indexer", functions=_per_dtype("index_scores", "pool_index_keys")),
    KernelSource(name="dsa_select", functions=("select_positions",)),
)
SOURCES_BY_NAME = {source.name: source for source in KERNEL_SOURCES}


def _read(file_name: str) -> str:
    return resources.files("metrale_kernels.cuda").joinpath("kernels", file_name).read_text()


def source_code(source: KernelSource) -> str:
    """The full translation unit: the prelude, the source's headers, then the kernel file."""
    return "\n".join(_read(name) for name in (PRELUDE, *source.headers, source.file_name))
