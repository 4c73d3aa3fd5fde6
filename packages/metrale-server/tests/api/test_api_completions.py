"""``/v1/completions``: response shape, usage, streaming framing and parity, n, stop, logprobs,
echo, several prompts, include_usage and the request timeout."""

from __future__ import annotations

from typing import Any

PATH = "/v1/completions"
PROMPT = "The quick brown fox"


def greedy(**fields: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **fields}


def post(server: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = server.client.post(PATH, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def stream(server: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = server.client.post(PATH, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return server.parse_sse(response.content)  # type: ignore[no-any-return]


def streamed_texts(chunks: list[dict[str, Any]]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts


def finish_reasons(chunks: list[dict[str, Any]]) -> dict[int, list[str]]:
    reasons: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["finish_reason"] is not None:
                reasons.setdefault(choice["index"], []).append(choice["finish_reason"])
    return reasons


def num_prompt_tokens(server: Any, prompt: str) -> int:
    return int(server.client.post("/tokenize", json={"prompt": prompt}).json()["count"])


def test_response_shape_and_usage(server: Any) -> None:
    body = post(server, greedy())
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "tiny-llama"
    [choice] = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
    assert choice["index"] == 0
    assert choice["text"]
    assert choice["logprobs"] is None
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] == num_prompt_tokens(server, PROMPT)
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12


def test_streamed_greedy_text_equals_the_whole_response(server: Any) -> None:
    whole = post(server, greedy(max_tokens=24))
    chunks = stream(server, greedy(max_tokens=24))
    assert len(chunks) >= 2
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
    assert chunks[0]["id"].startswith("cmpl-")
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert all("usage" not in chunk for chunk in chunks)
    assert streamed_texts(chunks) == {0: whole["choices"][0]["text"]}
    assert finish_reasons(chunks) == {0: ["length"]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_token_id_prompt_gives_the_same_text_as_its_string(server: Any) -> None:
    ids = server.client.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert post(server, greedy(prompt=ids))["choices"] == post(server, greedy())["choices"]


def test_n_two_sums_usage_and_streams_both_choices(server: Any) -> None:
    sampled = {"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "n": 2, "seed": 7}
    body = post(server, sampled)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["text"] != body["choices"][1]["text"]
    assert body["usage"]["completion_tokens"] == 20
    assert body["usage"]["prompt_tokens"] == num_prompt_tokens(server, PROMPT)
    chunks = stream(server, sampled)
    expected = {c["index"]: c["text"] for c in body["choices"]}
    assert streamed_texts(chunks) == expected
    assert finish_reasons(chunks) == {0: ["length"], 1: ["length"]}


def test_stop_string_ends_the_text_before_it(server: Any) -> None:
    text = post(server, greedy(max_tokens=20))["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip()
    body = post(server, greedy(max_tokens=20, stop=["never-seen-stop", stop]))
    [choice] = body["choices"]
    assert choice["text"] == text[: text.index(stop)]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    chunks = stream(server, greedy(max_tokens=20, stop=stop))
    assert streamed_texts(chunks) == {0: choice["text"]}
    assert finish_reasons(chunks) == {0: ["stop"]}


def test_logprobs_shape_whole_and_streamed(server: Any) -> None:
    body = post(server, greedy(logprobs=3))
    [choice] = body["choices"]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    num_tokens = body["usage"]["completion_tokens"]
    for key in logprobs:
        assert len(logprobs[key]) == num_tokens
    assert all(isinstance(t, str) for t in logprobs["tokens"])
    assert all(lp <= 0.0 for lp in logprobs["token_logprobs"])
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert 3 <= len(top) <= 4
        assert top[token] == logprob
        assert max(top.values()) >= logprob
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    chunks = stream(server, greedy(logprobs=3))
    streamed: dict[str, list[Any]] = {key: [] for key in logprobs}
    for chunk in chunks:
        for key in logprobs:
            streamed[key] += chunk["choices"][0]["logprobs"][key]
    assert streamed == logprobs


def test_logprobs_zero_reports_the_chosen_token_only(server: Any) -> None:
    logprobs = post(server, greedy(logprobs=0))["choices"][0]["logprobs"]
    assert all(len(top) == 1 for top in logprobs["top_logprobs"])


def test_include_usage_adds_a_last_chunk_with_usage_and_no_choices(server: Any) -> None:
    whole = post(server, greedy())
    chunks = stream(server, greedy(stream_options={"include_usage": True}))
    *text_chunks, last = chunks
    assert last["choices"] == []
    assert last["usage"] == whole["usage"]
    assert all(chunk["usage"] is None for chunk in text_chunks)


def test_echo_prepends_the_prompt(server: Any) -> None:
    plain = post(server, greedy())["choices"][0]["text"]
    echoed = post(server, greedy(echo=True))
    assert echoed["choices"][0]["text"] == PROMPT + plain
    assert echoed["usage"]["completion_tokens"] == 12
    chunks = stream(server, greedy(echo=True))
    assert chunks[0]["choices"][0]["text"] == PROMPT
    assert streamed_texts(chunks) == {0: PROMPT + plain}
    ids = server.client.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert post(server, greedy(prompt=ids, echo=True))["choices"][0]["text"] == PROMPT + plain


def test_several_prompts_give_n_choices_each(server: Any) -> None:
    prompts = [PROMPT, "Once upon a time"]
    body = post(server, greedy(prompt=prompts, n=2))
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for index, prompt in enumerate(prompts):
        alone = post(server, greedy(prompt=prompt))["choices"][0]["text"]
        assert body["choices"][2 * index]["text"] == alone
        assert body["choices"][2 * index + 1]["text"] == alone
    assert body["usage"]["prompt_tokens"] == sum(num_prompt_tokens(server, p) for p in prompts)
    assert body["usage"]["completion_tokens"] == 4 * 12
    chunks = stream(server, greedy(prompt=prompts, n=2))
    assert streamed_texts(chunks) == {c["index"]: c["text"] for c in body["choices"]}


def test_a_request_past_the_timeout_finishes_with_reason_timeout(server: Any) -> None:
    long_request = greedy(max_tokens=480, prompt=[5, 6, 7])
    full_text = post(server, long_request)["choices"][0]["text"]
    with server.overridden(request_timeout_s=0.05):
        body = post(server, long_request)
        chunks = stream(server, long_request)
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] < 480
    assert full_text.startswith(choice["text"])
    assert finish_reasons(chunks) == {0: ["length"]}
    assert full_text.startswith(streamed_texts(chunks)[0])
    server.wait_idle()


def test_logit_bias_stop_token_ids_and_min_tokens(server: Any) -> None:
    tokenizer = server.engine.loaded.tokenizer
    forced = tokenizer.encode(" banana", add_special_tokens=False)[0]
    biased = post(server, greedy(max_tokens=5, logit_bias={str(forced): 100}))
    assert biased["choices"][0]["text"] == tokenizer.decode([forced] * 5)
    stopped = post(
        server, greedy(max_tokens=5, logit_bias={str(forced): 100}, stop_token_ids=[forced])
    )
    [choice] = stopped["choices"]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("", "stop", forced)
    assert stopped["usage"]["completion_tokens"] == 1
    eos = server.engine.eos_token_ids[0]
    held = post(
        server,
        greedy(max_tokens=6, min_tokens=4, ignore_eos=False, logit_bias={str(eos): 100}),
    )
    assert held["usage"]["completion_tokens"] == 5  # 4 held back from EOS, then EOS
    assert held["choices"][0]["finish_reason"] == "stop"


def test_seeded_sampling_is_reproducible(server: Any) -> None:
    sampled = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 11}
    first = post(server, sampled)["choices"][0]["text"]
    assert post(server, sampled)["choices"][0]["text"] == first
    assert post(server, {**sampled, "seed": 12})["choices"][0]["text"] != first


def test_a_repeated_prompt_reports_its_cached_tokens(server: Any) -> None:
    # Prefix caching is on by default: the second request reuses the first one's full blocks.
    prompt = " ".join(f"word{i}" for i in range(40))
    first = post(server, greedy(prompt=prompt))
    second = post(server, greedy(prompt=prompt))
    num_prompt = first["usage"]["prompt_tokens"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (num_prompt - 1) // 16 * 16  # whole blocks; the last token is recomputed
    assert cached >= 16
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
