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


ProgressObserver = Callable[[int, int], None]


@contextmanager
def load_progress(
    total: int,
    description: str,
    *,
    stream: TextIO | None = None,
    on_progress: ProgressObserver | None = None,
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``: a bar on ``stream`` (default stderr) when enabled, and a call of
    ``on_progress(done, total)`` (from the loading thread) at the start and on every advance."""
    stream = sys.stderr if stream is None else stream
    done = 0

    def observe(n: int) -> None:
        nonlocal done
        done += n
        if on_progress is not None:
            on_progress(done, total)

    observe(0)
    if not is_progress_enabled(stream):
        yield observe
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

    def advance(n: int) -> None:
        progress.advance(task, n)
        observe(n)

    with progress:
        yield advance
