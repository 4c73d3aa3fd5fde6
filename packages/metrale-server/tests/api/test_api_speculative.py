"""A server with speculative decoding (n-gram, or a draft model: here the target itself)
answers greedy requests token for token as the plain server does, and exports its draft
counters."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import attrs
import pytest

from metrale_server import EngineArgs, build_engine
from metrale_server.speculative_config import SpeculativeConfig

from .conftest import RunningServer


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_over_http_is_identical_on_50_prompts(
    serve_engine: Callable[..., AbstractContextManager[RunningServer]],
    tiny_model_dir: Path,
    method: str,
) -> None:
    rng = random.Random(5)
    prompts = []
    for _ in range(50):
        passage = [rng.randrange(100, 40000) for _ in range(rng.randint(3, 10))]
        prompts.append(passage * rng.randint(1, 3))
    # float32 weights: int8 is slower than float32 at these tiny widths.
    args = EngineArgs(
        model=str(tiny_model_dir), dtype="float32", quantization="none", max_batch_size=32
    )
    speculative_config = SpeculativeConfig(
        method=method,
        num_speculative_tokens=3,
        model=str(tiny_model_dir) if method == "draft_model" else None,
    )
    engine = build_engine(attrs.evolve(args, speculative_config=speculative_config))

    def completions(target: RunningServer) -> list[str]:
        response = target.client.post(
            "/v1/completions",
            json={"prompt": prompts, "max_tokens": 48, "temperature": 0, "ignore_eos": True},
        )
        assert response.status_code == 200, response.text
        return [choice["text"] for choice in response.json()["choices"]]

    with serve_engine(build_engine(args)) as plain:
        expected = completions(plain)
    with serve_engine(engine) as speculative:
        assert completions(speculative) == expected
        assert speculative.metric("metrale_spec_decode_num_draft_tokens_total") > 0
        accepted = speculative.metric("metrale_spec_decode_num_accepted_tokens_total")
        assert accepted == engine.stats.num_accepted_tokens > 0
        by_position = engine.stats.num_accepted_by_position
        assert sum(by_position) == accepted
        # A draft is kept only after every draft before it was: counts never grow with position.
        assert list(by_position) == sorted(by_position, reverse=True)
        first = speculative.metric(
            "metrale_spec_decode_num_accepted_tokens_per_pos_total", 'position="0"'
        )
        assert first == by_position[0]
        speculative.wait_idle()
