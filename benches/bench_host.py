"""The machine a bench ran on, printed first by every bench in this folder.

Figures from two machines are not comparable without this beside them: the same weight format
runs different kernels on a CPU with int8 dot products (AVX-512 VNNI, AMX) than on one with
AVX2 only. ``cpu_line()`` is one line for stdout, ``host_fields()`` the same for a JSON file.
"""

from __future__ import annotations

from typing import Any

from metrale_bench import describe_host
from metrale_kernels.cpu_features import BF16_DOT_FLAGS, INT8_DOT_FLAGS, cpu_features

# The vector flags that decide which kernels run, widest last, then the dot-product flags.
SHOWN_FLAGS = ("avx2", "fma", "avx512f", *INT8_DOT_FLAGS, *BF16_DOT_FLAGS)


def cpu_flags() -> list[str]:
    """The flags of :data:`SHOWN_FLAGS` this CPU has (``asimd`` on arm64), in that order."""
    flags = cpu_features().flags
    return [flag for flag in (*SHOWN_FLAGS, "asimd") if flag in flags]


def host_fields() -> dict[str, Any]:
    """CPU model, logical CPUs, architecture and flags, for a bench's JSON output."""
    host = describe_host()
    features = cpu_features()
    return {
        "cpu_model": host.cpu_model,
        "num_cpus": host.num_cpus,
        "machine": features.machine,
        "cpu_flags": cpu_flags(),
        "int8_dot": features.int8_dot,
        "bf16_dot": features.bf16_dot,
        "system": host.system,
    }


def cpu_line() -> str:
    """E.g. ``cpu: AMD EPYC, 2 logical CPUs, x86_64: avx2 fma (no int8/bf16 dot products)``."""
    fields = host_fields()
    flags = " ".join(fields["cpu_flags"]) or "none of " + " ".join(SHOWN_FLAGS)
    missing = [
        name
        for name, present in (("int8", fields["int8_dot"]), ("bf16", fields["bf16_dot"]))
        if not present
    ]
    note = f" (no {'/'.join(missing)} dot products)" if missing else ""
    return (
        f"cpu: {fields['cpu_model'] or 'unknown model'}, {fields['num_cpus']} logical CPUs, "
        f"{fields['machine']}: {flags}{note}"
    )
