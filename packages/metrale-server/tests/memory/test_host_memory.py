"""Host memory readings: the pure parsers on well-formed, malformed and missing text, and the
readers on this Linux machine (where every reading exists)."""

from __future__ import annotations

import mmap
import subprocess
import sys
from pathlib import Path

import pytest

from metrale_server.memory import host_memory
from metrale_server.memory.host_memory import (
    cgroup_limit,
    cgroup_limit_bytes,
    host_total_memory_bytes,
    kib_field,
    mem_available_at_start_bytes,
    mem_available_bytes,
    physical_memory_bytes,
    read_host_file,
    record_mem_available_at_start,
    rss_anon_bytes,
)

MEMINFO = """\
MemTotal:       24682116 kB
MemFree:        19512000 kB
MemAvailable:   23000004 kB
Buffers:          100000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""
STATUS = """\
Name:\tpython
VmRSS:\t  123456 kB
RssAnon:\t   98304 kB
RssFile:\t   25152 kB
Threads:\t4
"""


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        (MEMINFO, "MemTotal", 24682116 * 1024),
        (MEMINFO, "MemAvailable", 23000004 * 1024),
        (MEMINFO, "Hugepagesize", 2048 * 1024),
        (STATUS, "RssAnon", 98304 * 1024),
        (STATUS, "VmRSS", 123456 * 1024),
        ("MemAvailable: 0 kB\n", "MemAvailable", 0),
        ("MemAvailable: 7 kB", "MemAvailable", 7 * 1024),  # no final newline
    ],
)
def test_kib_field_reads_a_kib_line_in_bytes(text: str, key: str, expected: int) -> None:
    assert kib_field(text, key) == expected


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("", "MemAvailable"),
        (MEMINFO, "RssAnon"),  # absent
        (MEMINFO, "Mem"),  # a prefix of a key is not the key
        (MEMINFO, "MemTotal "),
        (STATUS, "Threads"),  # a count, not kB
        (MEMINFO, "HugePages_Total"),  # no unit
        ("MemAvailable: 12 MB\n", "MemAvailable"),
        ("MemAvailable: twelve kB\n", "MemAvailable"),
        ("MemAvailable: -12 kB\n", "MemAvailable"),
        ("MemAvailable: 1.5 kB\n", "MemAvailable"),
        ("MemAvailable: 12 kB extra\n", "MemAvailable"),
        ("MemAvailable:\n", "MemAvailable"),
        ("MemAvailable 12 kB\n", "MemAvailable"),  # no colon
        ("MemAvailable: \ufffd\ufffd kB\n", "MemAvailable"),  # bytes that did not decode
        ("\x00\x01garbage", "MemAvailable"),
        ("MemAvailable: \u00b2 kB\n", "MemAvailable"),  # a digit int() does not take
    ],
)
def test_kib_field_is_none_when_missing_or_malformed(text: str, key: str) -> None:
    assert kib_field(text, key) is None


def test_kib_field_reads_the_first_line_of_a_key() -> None:
    assert kib_field("MemAvailable: 1 kB\nMemAvailable: 2 kB\n", "MemAvailable") == 1024
    assert kib_field("MemAvailable: x kB\nMemAvailable: 2 kB\n", "MemAvailable") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8589934592\n", 8589934592),
        ("  1073741824  ", 1073741824),
        ("4096", 4096),
        ("max\n", None),  # cgroup v2: no limit
        ("9223372036854771712\n", None),  # cgroup v1: "no limit" is a huge page-rounded number
        (str(2**60), None),
        (str(2**60 - 1), 2**60 - 1),
        ("", None),
        ("\n", None),
        ("-1\n", None),
        ("12 kB\n", None),
        ("1.5e9\n", None),
        ("unlimited", None),
        ("\u00b2", None),  # a digit int() does not take
    ],
)
def test_cgroup_limit(text: str, expected: int | None) -> None:
    assert cgroup_limit(text) == expected


def test_read_host_file_is_none_for_a_missing_or_unreadable_path(tmp_path: Path) -> None:
    assert read_host_file(str(tmp_path / "no-such-file")) is None
    assert read_host_file(str(tmp_path)) is None  # a directory
    text_file = tmp_path / "meminfo"
    text_file.write_bytes(b"MemAvailable: 5 kB\n\xff\xfe\n")
    text = read_host_file(str(text_file))
    assert text is not None
    assert kib_field(text, "MemAvailable") == 5 * 1024


# --- the readers on this machine ------------------------------------------------------------


def test_every_reading_exists_on_this_linux_machine() -> None:
    physical = physical_memory_bytes()
    available = mem_available_bytes()
    rss = rss_anon_bytes()
    total = host_total_memory_bytes()
    for reading in (physical, available, rss, total):
        assert isinstance(reading, int)
        assert reading > 0
    assert physical is not None
    assert available is not None
    assert total is not None
    assert available <= physical
    assert total <= physical
    limit = cgroup_limit_bytes()
    assert limit is None or total == min(physical, limit)
    assert limit is not None or total == physical


def test_rss_anon_grows_with_an_anonymous_allocation() -> None:
    # A fresh private mapping: malloc could hand back pages that are already resident.
    size = 64 * 2**20
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    before = rss_anon_bytes()
    for offset in range(0, size, mmap.PAGESIZE):  # touch every page
        block[offset] = 1
    after = rss_anon_bytes()
    block.close()
    assert before is not None
    assert after is not None
    assert after - before >= 48 * 2**20


def test_physical_memory_matches_meminfo() -> None:
    text = read_host_file(host_memory.MEMINFO)
    assert text is not None
    assert physical_memory_bytes() == kib_field(text, "MemTotal")


def test_mem_available_at_start_is_sampled_once() -> None:
    record_mem_available_at_start()
    first = mem_available_at_start_bytes()
    assert isinstance(first, int)
    assert first > 0
    hold = bytearray(32 * 2**20)
    hold[::4096] = b"\x01" * len(hold[::4096])
    record_mem_available_at_start()
    assert mem_available_at_start_bytes() == first
    del hold


def test_a_process_that_never_sampled_reports_no_start_reading() -> None:
    script = (
        "from metrale_server.memory.host_memory import *\n"
        "print(mem_available_at_start_bytes())\n"
        "record_mem_available_at_start()\n"
        "print(mem_available_at_start_bytes())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    before, after = result.stdout.split()
    assert before == "None"
    assert int(after) > 0
