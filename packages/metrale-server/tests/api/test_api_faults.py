"""One request's fault fails that request only: a fault injected into one stream's
detokenization and one into another's grammar, in a batch of 32 streams, end those two with an
error event; the 30 others finish with the text they have without the faults, and nothing
leaks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from metrale_server.engine.core import EngineCore
from metrale_server.engine.core_request import EngineCoreRequest
from metrale_server.output.processor import OutputProcessor, RequestState
from metrale_server.structured.matcher import GrammarMatcher

CHAT = "/v1/chat/completions"
DETOKENIZER_FAULT = "please fail my detokenizer"
NUM_STREAMS = 32


def request(index: int, content: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content or f"Tell me about the number {index}."}]
    return {
        "model": "tiny-llama",
        "messages": messages,
        "max_tokens": 12,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }


async def stream_all(base_url: str, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every stream at once; per stream its text and the error event, if one came."""

    async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        text, error = "", None
        async with client.stream("POST", CHAT, json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    error = event["error"]
                    continue
                for choice in event["choices"]:
                    text += choice["delta"].get("content") or ""
        return {"text": text, "error": error}

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        return list(await asyncio.gather(*(one(client, body) for body in bodies)))


class FaultyGrammar:
    """A grammar that, on the third token it is fed, raises or refuses the token its own mask
    allowed, or raises whenever the sampler asks for its mask from the third on, as a faulty
    library would; one fault each."""

    def __init__(self, inner: GrammarMatcher, fault: str) -> None:
        self.inner = inner
        self.fault = fault
        self.num_fed = 0
        self.num_masks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self.num_masks += 1
        if self.fault == "mask raises" and self.num_masks >= 3:
            raise RuntimeError("injected grammar mask fault")
        self.inner.fill_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        self.num_fed += 1
        if self.num_fed == 3 and self.fault == "raises":
            raise RuntimeError("injected grammar fault")
        if self.num_fed == 3 and self.fault == "refuses":
            return False
        return self.inner.accept_token(token_id)


# "mask raises" faults the batched sampler: the step samples each row alone to isolate it.
@pytest.mark.parametrize("grammar_fault", ["raises", "refuses", "mask raises"])
def test_a_fault_in_one_stream_fails_it_alone(
    server: Any, monkeypatch: pytest.MonkeyPatch, grammar_fault: str
) -> None:
    good = [request(index) for index in range(NUM_STREAMS - 2)]
    expected = asyncio.run(stream_all(server.base_url, good))
    assert all(result["error"] is None and result["text"] for result in expected)

    apply = OutputProcessor._apply

    def faulty_apply(self: OutputProcessor, state: RequestState, delta: Any) -> bool:
        if state.prompt is not None and DETOKENIZER_FAULT in state.prompt:
            raise RuntimeError("injected detokenizer fault")
        return apply(self, state, delta)

    core: EngineCore = server.engine.core
    add_request = core.add_request

    def add_with_faulty_grammar(request: EngineCoreRequest) -> None:
        add_request(request)
        for seq in core._groups[request.request_id].seqs:
            if seq.grammar is not None:
                seq.grammar = FaultyGrammar(seq.grammar, grammar_fault)  # type: ignore[assignment]

    monkeypatch.setattr(OutputProcessor, "_apply", faulty_apply)
    monkeypatch.setattr(core, "add_request", add_with_faulty_grammar)
    faulty = [
        request(100, DETOKENIZER_FAULT),
        request(101, structured_outputs={"regex": "[a-z ]{30}"}),
    ]
    results = asyncio.run(stream_all(server.base_url, [*faulty, *good]))
    for result in results[:2]:
        assert result["error"] is not None, result
        assert result["error"]["code"] == "internal_error"
        assert "injected" not in result["error"]["message"]
    assert results[2:] == expected
    server.wait_idle()
