"""Request preparation (JSON parsing, the chat template, the tokenizer) off the event loop.

Each is bounded by the body limit and the prompt-length check, but a long prompt still takes
seconds to render and tokenize; on the event loop that stalled ``/health`` and every stream
for as long. A worker thread does it instead, each request within a time budget. One, not
more: JSON parsing and template rendering hold the interpreter lock, and with two such threads
ten 300 KB bodies at once kept the event loop from /health for 50-80 ms more (measured).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from metrale_server.api.errors import ApiError

T = TypeVar("T")

PREPARE_WORKERS = 1
PREPARE_TIMEOUT_S = 30.0


class RequestPreparer:
    """Runs a request's preparation on ``workers`` threads; a 400 past ``timeout_s``."""

    def __init__(self, workers: int = PREPARE_WORKERS, timeout_s: float = PREPARE_TIMEOUT_S):
        self._pool = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="metrale-prepare"
        )
        self.timeout_s = timeout_s

    async def run(
        self,
        prepare: Callable[[], T],
        *,
        timeout_s: float | None = None,
        what: str = "preparing the request (its chat template and tokenization)",
        param: str | None = None,
    ) -> T:
        """``prepare()`` on the pool; a 400 (``param`` at fault) when it takes over
        ``timeout_s`` (default: the preparer's). The thread finishes its work regardless; the
        request no longer waits for it."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        future = asyncio.get_running_loop().run_in_executor(self._pool, prepare)
        try:
            return await asyncio.wait_for(future, budget)
        except TimeoutError:
            raise ApiError(
                400, f"{what} took over {budget:g} s", param=param, code="prepare_timeout"
            ) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
