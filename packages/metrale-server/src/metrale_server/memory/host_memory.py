"""Host memory readings: ``MemAvailable``, ``RssAnon``, physical RAM and the cgroup limit.

Only :func:`read_host_file` touches the filesystem; parsing is pure. A reading that cannot be
taken is ``None``, never a substituted number. ``MemAvailable`` at start is sampled once per
process, before the model loads (:func:`record_mem_available_at_start`).
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("metrale.memory")

MEMINFO = "/proc/meminfo"
SELF_STATUS = "/proc/self/status"
CGROUP_V2_LIMIT = "/sys/fs/cgroup/memory.max"
CGROUP_V1_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
# cgroup v1 reports "no limit" as a huge page-rounded number.
_CGROUP_UNLIMITED_FLOOR = 2**60

_start_lock = threading.Lock()
_mem_available_at_start: list[int | None] = []


def read_host_file(path: str) -> str | None:
    """The text of one ``/proc`` or ``/sys`` file; ``None`` (and a debug line) if unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError as error:
        logger.debug("reading %s failed: %s; the reading is null", path, error)
        return None


def kib_field(text: str, key: str) -> int | None:
    """The value of a ``Key:   <n> kB`` line in bytes; ``None`` if absent or malformed."""
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or name != key:
            continue
        parts = rest.split()
        if len(parts) != 2 or parts[1] != "kB" or not parts[0].isdecimal():
            return None
        return int(parts[0]) * 1024
    return None


def cgroup_limit(text: str) -> int | None:
    """A cgroup memory limit file's value; ``None`` for ``max`` (v2) or v1's "unlimited"."""
    value = text.strip()
    if not value.isdecimal():
        return None
    limit = int(value)
    return None if limit >= _CGROUP_UNLIMITED_FLOOR else limit


def mem_available_bytes() -> int | None:
    text = read_host_file(MEMINFO)
    return None if text is None else kib_field(text, "MemAvailable")


def rss_anon_bytes() -> int | None:
    text = read_host_file(SELF_STATUS)
    return None if text is None else kib_field(text, "RssAnon")


def physical_memory_bytes() -> int | None:
    text = read_host_file(MEMINFO)
    if text is not None:
        return kib_field(text, "MemTotal")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def cgroup_limit_bytes() -> int | None:
    for path in (CGROUP_V2_LIMIT, CGROUP_V1_LIMIT):
        text = read_host_file(path)
        if text is not None:
            return cgroup_limit(text)
    return None


def host_total_memory_bytes() -> int | None:
    """What a CPU serve may use: physical RAM or the cgroup limit, whichever is smaller."""
    readings = [r for r in (physical_memory_bytes(), cgroup_limit_bytes()) if r is not None]
    return min(readings) if readings else None


def record_mem_available_at_start() -> None:
    """Sample ``MemAvailable`` the first time only; later calls keep the first sample."""
    with _start_lock:
        if not _mem_available_at_start:
            _mem_available_at_start.append(mem_available_bytes())


def mem_available_at_start_bytes() -> int | None:
    with _start_lock:
        return _mem_available_at_start[0] if _mem_available_at_start else None
