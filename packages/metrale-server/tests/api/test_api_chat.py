"""``/v1/chat/completions``: shape, roles and content parts, streaming framing and parity, n,
stop, logprobs and include_usage."""

from __future__ import annotations

from typing import Any

PATH = "/v1/chat/completions"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]


def greedy(**fields: Any) -> dict[str, Any]:
    return {
        "model": "tiny-llama",
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        **fields,
    }


def post(server: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = server.client.post(PATH, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def stream(server: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = server.client.post(PATH, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    return server.parse_sse(response.content)  # type: ignore[no-any-return]


def contents(chunks: list[dict[str, Any]]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            index = choice["index"]
            texts[index] = texts.get(index, "") + choice["delta"].get("content", "")
    return texts


def test_response_shape_and_usage(server: Any) -> None:
    body = post(server, greedy())
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == "tiny-llama"
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["message"]["content"]
    assert choice["logprobs"] is None
    assert choice["finish_reason"] == "length"
    tokenized = server.client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert body["usage"]["prompt_tokens"] == tokenized["count"]
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["total_tokens"] == tokenized["count"] + 12


def test_text_parts_read_like_a_string(server: Any) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]
    plain = [{"role": "user", "content": "Name a colour."}]
    assert post(server, greedy(messages=parts)) | {"id": 0, "created": 0} == post(
        server, greedy(messages=plain)
    ) | {"id": 0, "created": 0}


def test_stream_framing_role_first_and_parity_with_the_whole_response(server: Any) -> None:
    whole = post(server, greedy(max_tokens=20))
    chunks = stream(server, greedy(max_tokens=20))
    first = chunks[0]
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
         "finish_reason": None}
    ]  # fmt: skip
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert {chunk["id"] for chunk in chunks} == {first["id"]}
    assert first["id"].startswith("chatcmpl-")
    assert contents(chunks) == {0: whole["choices"][0]["message"]["content"]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_n_two_streams_a_role_chunk_and_a_finish_per_choice(server: Any) -> None:
    sampled = greedy(temperature=1.0, n=2, seed=3)
    body = post(server, sampled)
    chunks = stream(server, sampled)
    role_chunks = [c for c in chunks if c["choices"][0]["delta"].get("role") == "assistant"]
    assert sorted(c["choices"][0]["index"] for c in role_chunks) == [0, 1]
    assert contents(chunks) == {c["index"]: c["message"]["content"] for c in body["choices"]}
    finishes = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finishes) == [0, 1]
    assert body["usage"]["completion_tokens"] == 24


def test_stop_string(server: Any) -> None:
    text = post(server, greedy(max_tokens=20))["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    body = post(server, greedy(max_tokens=20, stop=stop))
    assert body["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_logprobs_shape_whole_and_streamed(server: Any) -> None:
    body = post(server, greedy(logprobs=True, top_logprobs=2))
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert isinstance(entry["token"], str)
        assert entry["logprob"] <= 0.0
        assert all(isinstance(b, int) and 0 <= b < 256 for b in entry["bytes"])
        assert len(entry["top_logprobs"]) == 2
        for top in entry["top_logprobs"]:
            assert set(top) == {"token", "logprob", "bytes"}
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
        # Greedy: the chosen token is the most likely one.
        assert entry["top_logprobs"][0]["token"] == entry["token"]
    assert (
        bytes(b for e in content for b in e["bytes"]).decode()
        == body["choices"][0]["message"]["content"]
    )
    chunks = stream(server, greedy(logprobs=True, top_logprobs=2))
    streamed = [e for c in chunks[1:] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content


def test_logprobs_without_top_logprobs(server: Any) -> None:
    body = post(server, greedy(logprobs=True))
    content = body["choices"][0]["logprobs"]["content"]
    assert content
    assert all(entry["top_logprobs"] == [] for entry in content)


def test_max_completion_tokens_wins_over_max_tokens(server: Any) -> None:
    body = post(server, greedy(max_tokens=3, max_completion_tokens=5))
    assert body["usage"]["completion_tokens"] == 5


def test_include_usage(server: Any) -> None:
    whole = post(server, greedy())
    chunks = stream(server, greedy(stream_options={"include_usage": True}))
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == whole["usage"]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
