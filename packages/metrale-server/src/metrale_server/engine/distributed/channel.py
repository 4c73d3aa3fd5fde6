"""Rank 0's channel to the workers: each step's inputs (or a heartbeat) by broadcast.

Every collective of a step (the broadcast, the model's reductions, the logits gather) runs
under one lock, so the heartbeat, sent while no step has run for ``HEARTBEAT_S``, never
interleaves with them. A worker that dies breaks the next collective at once; one that hangs
breaks it at the process group's timeout. Either way the channel fails for good: it raises
:class:`WorkerLostError` naming the rank when it can, and tells its ``on_failure`` listeners.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import attrs
import torch.distributed as dist

from metrale_server.engine.step_inputs import StepInputs

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0


class WorkerLostError(RuntimeError):
    """A tensor-parallel worker died or stopped answering; the group cannot run any more."""


@attrs.frozen
class Heartbeat:
    pass


@attrs.frozen
class Stop:
    pass


Message = StepInputs | Heartbeat | Stop


def broadcast_message(message: Message | None) -> Message:
    """Rank 0 passes ``message``; every other rank passes ``None`` and gets rank 0's."""
    box: list[object] = [message]
    dist.broadcast_object_list(box, src=0)
    received = box[0]
    assert isinstance(received, StepInputs | Heartbeat | Stop)
    return received


class WorkerChannel:
    def __init__(self, describe_lost: Callable[[], str | None]) -> None:
        self._describe_lost = describe_lost
        self._lock = threading.Lock()
        self._last_send = time.monotonic()
        self._closed = threading.Event()
        self._listeners: list[Callable[[str], None]] = []
        self.failure: WorkerLostError | None = None
        self._heartbeat = threading.Thread(
            target=self._beat, name="metrale-tp-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def on_failure(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(message)`` (from whichever thread saw it) once the group fails."""
        self._listeners.append(listener)
        if self.failure is not None:
            listener(str(self.failure))

    @contextlib.contextmanager
    def step(self, inputs: StepInputs) -> Iterator[None]:
        with self._lock:
            if self.failure is not None:
                raise self.failure
            try:
                self._send(inputs)
                yield
            except Exception as error:
                raise self._fail(error) from error

    def close(self) -> None:
        """Tell the workers to exit (when the group still works); no more steps."""
        self._closed.set()
        with self._lock:
            if self.failure is None:
                with contextlib.suppress(Exception):
                    self._send(Stop())
            self.failure = self.failure or WorkerLostError("the tensor-parallel group is closed")

    def _send(self, message: Message) -> None:
        broadcast_message(message)
        self._last_send = time.monotonic()

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S / 2):
            with self._lock:
                if self.failure is not None or self._closed.is_set():
                    return
                if time.monotonic() - self._last_send < HEARTBEAT_S:
                    continue
                try:
                    self._send(Heartbeat())
                except Exception as error:
                    self._fail(error)
                    return

    def _fail(self, error: Exception) -> WorkerLostError:
        if self.failure is not None:
            return self.failure
        lost = self._describe_lost()
        message = (
            f"tensor-parallel {lost}" if lost else f"a tensor-parallel collective failed: {error}"
        )
        self.failure = WorkerLostError(message)
        logger.error("%s", message)
        for listener in self._listeners:
            listener(message)
        return self.failure
