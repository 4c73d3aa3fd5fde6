"""Request preparation (JSON parsing, the chat template, the tokenizer) off the event loop.

Each is bounded by the body limit and the prompt-length check, but a long prompt still takes
seconds to render and tokenize; on the event loop that stalled ``/health`` and every stream
for as long. A small pool of threads does it instead (the tokenizer releases the GIL while it
encodes), each request within a time budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from metrale_server.api.errors import ApiError

T = TypeVar("T")

PREPARE_WORKERS = 2
PREPARE_TIMEOUT_S = 30.0


class RequestPreparer:
    """Runs a request's preparation on ``workers`` threads; a 400 past ``timeout_s``."""

    def __init__(self, workers: int = PREPARE_WORKERS, timeout_s: float = PREPARE_TIMEOUT_S):
        self._pool = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="metrale-prepare"
        )
        self.timeout_s = timeout_s

    async def run(self, prepare: Callable[[], T]) -> T:
        future = asyncio.get_running_loop().run_in_executor(self._pool, prepare)
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise ApiError(
                400,
                f"preparing the request (its chat template and tokenization) took over "
                f"{self.timeout_s:g} s; send a shorter prompt",
                code="prepare_timeout",
            ) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
