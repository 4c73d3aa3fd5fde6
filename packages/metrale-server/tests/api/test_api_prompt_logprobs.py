"""Prompt logprobs over HTTP: ``echo`` with ``logprobs`` (lm-eval's loglikelihood request) and
vLLM's ``prompt_logprobs`` on completions and chat, against transformers' log-softmax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Any:
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)

    def log_softmax(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([token_ids])).logits[0].float(), dim=-1)

    return log_softmax


def prompt_ids(server: Any, prompt: str = PROMPT) -> list[int]:
    return list(server.client.post("/tokenize", json={"prompt": prompt}).json()["tokens"])


def completion(server: Any, **fields: Any) -> dict[str, Any]:
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, **fields}
    response = server.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_echo_with_logprobs_is_the_prompts_loglikelihood(server: Any, reference: Any) -> None:
    """lm-eval's request: the echoed prompt's token logprobs equal transformers' log-softmax
    of the preceding position, the first token's is null; the sampled token follows."""
    ids = prompt_ids(server)
    expected = reference(ids)
    body = completion(server, echo=True, logprobs=2)
    [choice] = body["choices"]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(PROMPT)
    assert len(logprobs["tokens"]) == len(ids) + 1
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    got = logprobs["token_logprobs"][1 : len(ids)]
    want = [float(expected[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    assert got == pytest.approx(want, abs=1e-4)
    for position, top in enumerate(logprobs["top_logprobs"][1 : len(ids)]):
        assert 2 <= len(top) <= 3  # the chosen token and two alternatives
        best = int(expected[position].argmax())
        assert max(top.values()) == pytest.approx(float(expected[position, best]), abs=1e-4)
    # The generated token: the greedy choice after the prompt, offsets running on.
    assert logprobs["token_logprobs"][-1] == pytest.approx(float(expected[-1].max()), abs=1e-4)
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    assert offsets[-1] == len(PROMPT)
    assert body["usage"]["completion_tokens"] == 1


def test_several_prompts_and_token_ids(server: Any, reference: Any) -> None:
    prompts = [PROMPT, "Hello there, general"]
    body = completion(server, prompt=prompts, echo=True, logprobs=0)
    for prompt, choice in zip(prompts, body["choices"], strict=True):
        ids = prompt_ids(server, prompt)
        expected = reference(ids)
        got = choice["logprobs"]["token_logprobs"][1 : len(ids)]
        assert got == pytest.approx(
            [float(expected[i, ids[i + 1]]) for i in range(len(ids) - 1)], abs=1e-4
        )
    ids = prompt_ids(server)
    by_ids = completion(server, prompt=ids, echo=True, logprobs=0)["choices"][0]["logprobs"]
    by_text = body["choices"][0]["logprobs"]
    assert by_ids["token_logprobs"] == by_text["token_logprobs"]


def test_streamed_echo_with_logprobs_equals_whole(server: Any) -> None:
    fields = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    whole = completion(server, **fields, echo=True, logprobs=1)["choices"][0]
    response = server.client.post(
        "/v1/completions", json={**fields, "echo": True, "logprobs": 1, "stream": True}
    )
    assert response.status_code == 200
    chunks = [c for c in server.parse_sse(response.content) if c["choices"]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens, values = [], []
    for chunk in chunks:
        logprobs = chunk["choices"][0]["logprobs"]
        if logprobs is not None:
            tokens += logprobs["tokens"]
            values += logprobs["token_logprobs"]
    assert text == whole["text"]
    assert tokens == whole["logprobs"]["tokens"]
    assert values == whole["logprobs"]["token_logprobs"]


def test_prompt_logprobs_field_on_completions_and_chat(server: Any, reference: Any) -> None:
    ids = prompt_ids(server)
    expected = reference(ids)
    choice = completion(server, prompt_logprobs=3)["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids)
    assert entries[0] is None
    for position, entry in enumerate(entries[1:]):
        chosen = entry[str(ids[position + 1])]
        assert chosen["logprob"] == pytest.approx(
            float(expected[position, ids[position + 1]]), abs=1e-4
        )
        assert chosen["rank"] >= 1
        ranked = sorted((v["rank"], int(k)) for k, v in entry.items() if v["rank"] <= 3)
        assert [token for rank, token in ranked if rank <= 3][:3] == expected[position].topk(
            3
        ).indices.tolist()
        assert all(isinstance(v["decoded_token"], str) for v in entry.values())
    assert "prompt_logprobs" not in completion(server)["choices"][0]

    chat = server.client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
            "prompt_logprobs": 0,
        },
    )
    assert chat.status_code == 200, chat.text
    entries = chat.json()["prompt_logprobs"]
    assert entries[0] is None
    assert len(entries) == chat.json()["usage"]["prompt_tokens"]
    streamed = server.client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "prompt_logprobs": 0,
            "stream": True,
        },
    )
    assert streamed.status_code == 400
    assert streamed.json()["error"]["param"] == "prompt_logprobs"


def test_bad_prompt_logprobs_is_a_400(server: Any) -> None:
    for value in (-1, 21, "3"):
        response = server.client.post(
            "/v1/completions", json={"prompt": PROMPT, "prompt_logprobs": value}
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "prompt_logprobs"
    server.wait_idle()
    assert server.engine.block_manager.num_free_blocks == server.engine.num_kv_blocks
