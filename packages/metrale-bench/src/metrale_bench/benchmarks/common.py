"""What every driver does around its load: identify the server, warm up, record parameters."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from metrale_bench.datasets import BenchRequest, random_text
from metrale_bench.load import LoadResult, LoadSpec, run_load
from metrale_bench.progress import request_progress
from metrale_bench.streaming import SamplingSpec
from metrale_bench.target import ServerTarget, count_tokens, resolve_model, server_version

# The sample ``tokens_per_word`` is measured on: long enough that one word more or less, or a
# tokenizer's quirk at the start, moves the ratio by under a percent.
CALIBRATION_WORDS = 1000


@attrs.frozen(kw_only=True)
class ServerIdentity:
    """The model name a run sends, the server's ``/version`` document, and how many of its
    tokens a random-dataset word makes (``None``: the server has no ``/tokenize``)."""

    model: str
    version: dict[str, Any] | None
    tokens_per_word: float | None = None

    @property
    def prompt_tokens_per_word(self) -> float:
        """The ratio random prompts are sized with: measured, else one token per word."""
        return 1.0 if self.tokens_per_word is None else self.tokens_per_word

    def prompt_params(self) -> dict[str, Any]:
        """How random prompts were sized, for the record."""
        return {
            "tokens_per_word": self.prompt_tokens_per_word,
            "sized_by": "words" if self.tokens_per_word is None else "/tokenize",
        }


async def identify(target: ServerTarget) -> ServerIdentity:
    """The model, the version, and ``tokens_per_word`` measured on ``CALIBRATION_WORDS``
    random words through the server's ``/tokenize``."""
    async with target.client() as client:
        model = await resolve_model(client, target)
        version = await server_version(client)
        sample = random_text(CALIBRATION_WORDS, random.Random(0))
        count = await count_tokens(client, model, sample)
    tokens_per_word = None if not count else count / CALIBRATION_WORDS
    return ServerIdentity(model=model, version=version, tokens_per_word=tokens_per_word)


async def warm_up(
    target: ServerTarget, model: str, requests: Sequence[BenchRequest], sampling: SamplingSpec
) -> None:
    """Send ``requests`` one at a time and discard the outcomes (first-call costs, caches)."""
    if requests:
        await run_load(target, model, requests, load=LoadSpec(max_concurrency=1), sampling=sampling)


async def measured_load(
    target: ServerTarget,
    model: str,
    requests: Sequence[BenchRequest],
    *,
    load: LoadSpec,
    sampling: SamplingSpec,
    label: str,
    show_progress: bool,
) -> LoadResult:
    with request_progress(label, len(requests), enabled=show_progress) as on_outcome:
        return await run_load(
            target, model, requests, load=load, sampling=sampling, on_outcome=on_outcome
        )


def as_params(value: object) -> dict[str, Any]:
    """An attrs instance as JSON-ready parameters (paths become strings)."""

    def serialize(_: object, __: object, field_value: Any) -> Any:
        return str(field_value) if isinstance(field_value, Path) else field_value

    return attrs.asdict(value, value_serializer=serialize)  # type: ignore[arg-type]


def target_params(target: ServerTarget) -> dict[str, Any]:
    """The target's recorded parameters (never the API key)."""
    return {"api": target.api, "timeout_s": target.timeout_s}
