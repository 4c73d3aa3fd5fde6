"""What this CPU can do fast, read at run time: the kernels a weight format needs.

Machines of the same class differ (one has AVX2 only, another AVX-512 with BF16 and VNNI), so
formats are chosen from the flags the kernel reports, never assumed from the build.
"""

from __future__ import annotations

import functools
import platform

import attrs

CPUINFO = "/proc/cpuinfo"
# Dot products of int8 vectors accumulated in int32 (what ``torch._int_mm`` runs through oneDNN).
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16")


@attrs.frozen
class CpuFeatures:
    flags: frozenset[str]
    machine: str

    @property
    def int8_dot(self) -> bool:
        return any(flag in self.flags for flag in INT8_DOT_FLAGS) or self.machine == "aarch64"

    @property
    def int8_matmul(self) -> bool:
        """Int8 weights beat float32 here: int8 dot products, or AVX2 (measured with oneDNN
        capped at AVX2 on this machine: batch-1 decode 22 vs 46 ms, batch 16 58 vs 108 ms)."""
        return self.int8_dot or "avx2" in self.flags

    @property
    def bf16_dot(self) -> bool:
        return any(flag in self.flags for flag in BF16_DOT_FLAGS)

    def describe(self) -> str:
        """The flags that decide formats, e.g. ``avx512_vnni avx512_bf16`` (or ``avx2 only``)."""
        shown = [f for f in (*INT8_DOT_FLAGS, *BF16_DOT_FLAGS) if f in self.flags]
        if shown:
            return " ".join(shown)
        return "avx2, no int8/bf16 dot products" if "avx2" in self.flags else self.machine


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` (x86) or ``Features`` (arm) of the first processor in ``/proc/cpuinfo``."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in {"flags", "Features"}:
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_features() -> CpuFeatures:
    try:
        with open(CPUINFO, encoding="ascii", errors="replace") as handle:
            flags = parse_cpu_flags(handle.read())
    except OSError:
        flags = frozenset()
    return CpuFeatures(flags=flags, machine=platform.machine())
