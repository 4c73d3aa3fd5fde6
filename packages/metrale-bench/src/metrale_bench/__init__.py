"""Metrale benchmark wire types and harness (talks to servers over HTTP; never imports torch)."""

from metrale_bench.host import HostDescription, describe_host
from metrale_bench.metrics import ServeMetrics, Slo, compute_serve_metrics
from metrale_bench.outcome import RequestOutcome
from metrale_bench.records import BenchRecord, read_record, write_record
from metrale_bench.target import ServerTarget
from metrale_bench.wire import MemoryReport, MemoryReportError

__all__ = [
    "BenchRecord",
    "HostDescription",
    "MemoryReport",
    "MemoryReportError",
    "RequestOutcome",
    "ServeMetrics",
    "ServerTarget",
    "Slo",
    "compute_serve_metrics",
    "describe_host",
    "read_record",
    "write_record",
]
