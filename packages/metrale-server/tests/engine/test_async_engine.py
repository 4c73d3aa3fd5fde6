"""AsyncEngine: streams from a real engine thread, aborts free blocks, refusals raise at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from metrale_server import (
    LLM,
    AsyncEngine,
    Engine,
    EngineArgs,
    RequestError,
    RequestOutput,
    SamplingParams,
    build_engine,
)
from metrale_server.output.core_output import EngineCoreOutput
from metrale_server.output.processor import ProcessedOutputs


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return build_engine(EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=8))


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


async def collect(stream: object) -> list[RequestOutput]:
    return [output async for output in stream]  # type: ignore[attr-defined]


def test_streams_concatenate_to_the_final_output(engine: Engine) -> None:
    async def main() -> list[list[RequestOutput]]:
        async_engine = AsyncEngine(engine)
        try:
            streams = [
                async_engine.add_request(f"r{i}", [1000 + i, 2000, 3000 + i], greedy(8 + i))
                for i in range(5)
            ]
            return await asyncio.gather(*(collect(s) for s in streams))
        finally:
            async_engine.shutdown()

    results = asyncio.run(main())
    for i, outputs in enumerate(results):
        final = outputs[-1].outputs[0]
        assert outputs[-1].finished
        assert not any(o.finished for o in outputs[:-1])
        assert len(final.token_ids) == 8 + i
        assert "".join(o.outputs[0].delta_text for o in outputs) == final.text
        assert sum((o.outputs[0].delta_token_ids for o in outputs), ()) == final.token_ids
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_leaving_a_stream_early_aborts_and_frees_blocks(engine: Engine) -> None:
    async def main() -> None:
        async_engine = AsyncEngine(engine)
        try:
            stream = async_engine.add_request("long", [1234] * 40, greedy(200))
            async for output in stream:
                if len(output.outputs[0].token_ids) >= 3:
                    break
            await stream.aclose()  # type: ignore[attr-defined]
            survivor = await collect(async_engine.add_request("after", [5, 6, 7], greedy(4)))
            assert survivor[-1].outputs[0].finish_reason == "length"
        finally:
            async_engine.shutdown()

    asyncio.run(main())
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    assert not engine.has_unfinished_requests()


def test_abort_reports_finish_reason_abort(engine: Engine) -> None:
    async def main() -> RequestOutput:
        async_engine = AsyncEngine(engine)
        try:
            stream = async_engine.add_request("to-abort", [42] * 10, greedy(400))
            first = await stream.__anext__()  # type: ignore[attr-defined]
            assert not first.finished
            async_engine.abort("to-abort")
            rest = await collect(stream)
            return rest[-1]
        finally:
            async_engine.shutdown()

    last = asyncio.run(main())
    assert last.finished
    assert last.outputs[0].finish_reason == "abort"
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_a_request_that_can_never_fit_is_refused_at_once(engine: Engine) -> None:
    async def main() -> None:
        async_engine = AsyncEngine(engine)
        try:
            with pytest.raises(RequestError, match="max_seq_len"):
                async_engine.add_request("huge", [1] * 600, greedy(10))
            ok = await collect(async_engine.add_request("ok", [1, 2, 3], greedy(3)))
            assert len(ok[-1].outputs[0].token_ids) == 3
        finally:
            async_engine.shutdown()

    asyncio.run(main())


def test_engine_core_runs_on_its_own_thread_and_text_on_the_loop(engine: Engine) -> None:
    seen: list[str] = []
    processed: list[str] = []
    original = engine.core.step
    original_process = engine.processor.process

    def recording_step() -> list[EngineCoreOutput]:
        seen.append(threading.current_thread().name)
        return original()

    def recording_process(outputs: Iterable[EngineCoreOutput]) -> ProcessedOutputs:
        processed.append(threading.current_thread().name)
        return original_process(outputs)

    async def main() -> None:
        async_engine = AsyncEngine(engine)
        try:
            await collect(async_engine.add_request("t", [9, 9, 9], greedy(2)))
        finally:
            async_engine.shutdown()

    engine.core.step = recording_step  # type: ignore[method-assign]
    engine.processor.process = recording_process  # type: ignore[method-assign]
    try:
        asyncio.run(main())
    finally:
        del engine.core.step
        del engine.processor.process
    assert seen
    assert set(seen) == {"metrale-engine"}
    assert processed
    assert set(processed) == {threading.main_thread().name}


def test_both_drivers_apply_outputs_with_one_routine_and_count_what_finishes(
    engine: Engine,
) -> None:
    """``LLM`` (``Engine.step``) and the server's ``AsyncEngine`` apply a step's outputs through
    ``OutputProcessor.apply_core_outputs``: a stop string ends the same text under both, and
    the core counts each finished request once, whichever drove it."""
    calls: list[str] = []
    original = engine.processor.apply_core_outputs

    def recording_apply(*args: Any, **kwargs: Any) -> list[RequestOutput]:
        calls.append(threading.current_thread().name)
        return original(*args, **kwargs)

    free_text = LLM.from_engine(engine).generate({"prompt_token_ids": [4, 5, 6]}, greedy(12))
    stop = free_text[0].outputs[0].text[3:6]
    assert stop
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    engine.processor.apply_core_outputs = recording_apply  # type: ignore[method-assign]
    try:
        before = engine.stats.num_finished_requests
        by_llm = LLM.from_engine(engine).generate({"prompt_token_ids": [4, 5, 6]}, params)
        assert engine.stats.num_finished_requests == before + 1
        assert calls
        assert set(calls) == {threading.main_thread().name}

        async def main() -> list[RequestOutput]:
            async_engine = AsyncEngine(engine)
            try:
                return await collect(async_engine.add_request("s", [4, 5, 6], params))
            finally:
                async_engine.shutdown()

        calls.clear()
        by_server = asyncio.run(main())
    finally:
        del engine.processor.apply_core_outputs
    assert calls
    assert by_server[-1].outputs[0].text == by_llm[0].outputs[0].text
    assert by_llm[0].outputs[0].finish_reason == "stop"
    assert engine.stats.num_finished_requests == before + 2
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
