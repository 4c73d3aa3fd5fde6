"""The bench's small vocabulary: what a metric value and a record's parameters are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

# A metric is a number, or ``None`` for a reading that could not be taken (never a stand-in).
MetricValue = float | int | None
Metrics = Mapping[str, MetricValue]
# JSON-compatible parameters of a run, as recorded.
Params = Mapping[str, Any]
# The OpenAI-compatible endpoint a run streams from.
Api = Literal["completions", "chat"]
