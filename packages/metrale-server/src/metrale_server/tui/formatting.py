"""Short human-readable numbers for narrow panels."""

from __future__ import annotations

NOT_AVAILABLE = "n/a"


def format_bytes(num_bytes: int | None) -> str:
    if num_bytes is None:
        return NOT_AVAILABLE
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float | None) -> str:
    """Latencies: ``850 ms``, ``1.25 s``."""
    if seconds is None:
        return NOT_AVAILABLE
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def format_uptime(seconds: float | None) -> str:
    """``1d 02:03:04`` or ``02:03:04``."""
    if seconds is None:
        return "--:--:--"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {clock}" if days else clock


def format_rate(per_s: float | None) -> str:
    if per_s is None:
        return NOT_AVAILABLE
    return f"{per_s:,.1f}" if per_s < 100 else f"{per_s:,.0f}"


def format_percent(fraction: float | None) -> str:
    return NOT_AVAILABLE if fraction is None else f"{fraction * 100:.1f}%"
