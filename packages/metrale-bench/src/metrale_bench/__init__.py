"""Metrale benchmark wire types and harness (talks to servers over HTTP; never imports torch)."""

from metrale_bench.benchmarks.default_tier_boot import MemoryReport, MemoryReportError
from metrale_bench.host import HostDescription, describe_host

__all__ = ["HostDescription", "MemoryReport", "MemoryReportError", "describe_host"]
