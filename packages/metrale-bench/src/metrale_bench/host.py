"""A description of the machine a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import attrs

_CPUINFO = Path("/proc/cpuinfo")


@attrs.frozen(kw_only=True)
class HostDescription:
    """What a reader needs to compare two runs: CPU, cores, memory, OS and Python."""

    cpu_model: str | None
    num_cpus: int | None
    memory_bytes: int | None
    system: str
    python_version: str


def _cpu_model(cpuinfo: Path) -> str | None:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.processor() or None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform.processor() or None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_host(*, cpuinfo: Path = _CPUINFO) -> HostDescription:
    """Read this machine's description; a reading that cannot be taken is ``None``."""
    return HostDescription(
        cpu_model=_cpu_model(cpuinfo),
        num_cpus=os.cpu_count(),
        memory_bytes=_memory_bytes(),
        system=f"{platform.system()} {platform.release()} {platform.machine()}",
        python_version=platform.python_version(),
    )
