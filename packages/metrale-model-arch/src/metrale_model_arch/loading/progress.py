"""A progress bar for loading weights, silent where nobody watches."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

NO_PROGRESS_ENV = "METRALE_NO_PROGRESS"
_FALSY = ("", "0", "false", "no", "off")


def is_progress_enabled(
    stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """True when ``stream`` (default stderr) is a terminal and ``METRALE_NO_PROGRESS`` is unset
    or falsy (``0``, ``false``, ``no``, ``off``, empty)."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    if environ.get(NO_PROGRESS_ENV, "").strip().lower() not in _FALSY:
        return False
    return stream.isatty()


@contextmanager
def load_progress(
    total: int, description: str, *, stream: TextIO | None = None
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``: a bar on ``stream`` (default stderr) when enabled, else a no-op."""
    stream = sys.stderr if stream is None else stream
    if not is_progress_enabled(stream):
        yield lambda n: None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=stream),
        transient=True,
    )
    task = progress.add_task(description, total=total)
    with progress:
        yield lambda n: progress.advance(task, n)
