"""Rich progress on stderr while requests complete."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from metrale_bench.load import OnOutcome
from metrale_bench.outcome import RequestOutcome


@contextmanager
def request_progress(description: str, total: int, *, enabled: bool = True) -> Iterator[OnOutcome]:
    """A callback for ``run_load`` that advances a bar (failures counted in its label); with
    ``enabled`` false the callback does nothing."""
    if not enabled:
        yield lambda outcome: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total, failed=0)
        num_failed = 0

        def advance(outcome: RequestOutcome) -> None:
            nonlocal num_failed
            num_failed += not outcome.is_success
            progress.update(task, advance=1, failed=num_failed)

        yield advance
