"""Bad requests are 4xx in OpenAI's error shape naming the field; failures are 500s that leave
the server serving; auth and the body limit guard the routes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metrale_server import Engine
from metrale_server.output.core_output import EngineCoreOutput

USER = [{"role": "user", "content": "Hi"}]
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 4, **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny-llama", "messages": USER, "max_tokens": 4, **fields}


def without(body: dict[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key != name}


# (case id, path, JSON body or raw bytes, status, param, code)
BAD_REQUESTS: list[tuple[str, str, Any, int, str | None, str | None]] = [
    ("malformed-json", COMPLETIONS, b'{"prompt": "Hello",', 400, None, None),
    ("nan-is-not-json", COMPLETIONS, b'{"prompt": "Hi", "temperature": NaN}', 400, None, None),
    ("body-is-a-list", CHAT, b"[1, 2]", 400, None, None),
    ("body-is-a-string", COMPLETIONS, b'"hello"', 400, None, None),
    ("missing-prompt", COMPLETIONS, without(completion(), "prompt"), 400, "prompt", None),
    ("prompt-wrong-type", COMPLETIONS, completion(prompt=42), 400, "prompt", None),
    ("prompt-empty-list", COMPLETIONS, completion(prompt=[]), 400, "prompt", None),
    ("prompt-empty-string", COMPLETIONS, completion(prompt=""), 400, "prompt", None),
    ("prompt-id-out-of-vocab", COMPLETIONS, completion(prompt=[1, 10**6]), 400, "prompt", None),
    ("prompt-too-long", COMPLETIONS, completion(prompt=[100] * 600), 400, "prompt", None),
    ("missing-messages", CHAT, without(chat(), "messages"), 400, "messages", None),
    ("empty-messages", CHAT, chat(messages=[]), 400, "messages", None),
    ("messages-not-a-list", CHAT, chat(messages="hi"), 400, "messages", None),
    ("message-not-an-object", CHAT, chat(messages=["hi"]), 400, "messages[0]", None),
    (
        "bad-role",
        CHAT,
        chat(messages=[{"role": "wizard", "content": "x"}]),
        400,
        "messages[0].role",
        None,
    ),
    (
        "content-wrong-type",
        CHAT,
        chat(messages=[{"role": "user", "content": 7}]),
        400,
        "messages[0].content",
        None,
    ),
    (
        "image-part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "messages[0].content[0].type",
        None,
    ),
    ("max-tokens-string", COMPLETIONS, completion(max_tokens="5"), 400, "max_tokens", None),
    ("max-tokens-bool", COMPLETIONS, completion(max_tokens=True), 400, "max_tokens", None),
    ("max-tokens-float", COMPLETIONS, completion(max_tokens=2.5), 400, "max_tokens", None),
    ("max-tokens-zero", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens", None),
    ("max-tokens-negative", COMPLETIONS, completion(max_tokens=-3), 400, "max_tokens", None),
    ("max-tokens-huge", COMPLETIONS, completion(max_tokens=10**6), 400, "max_tokens", None),
    (
        "prompt-plus-max-tokens",
        COMPLETIONS,
        completion(prompt=[100] * 500, max_tokens=20),
        400,
        "max_tokens",
        None,
    ),
    (
        "max-completion-tokens-zero",
        CHAT,
        chat(max_completion_tokens=0),
        400,
        "max_completion_tokens",
        None,
    ),
    ("n-zero", COMPLETIONS, completion(n=0), 400, "n", None),
    ("n-too-large", COMPLETIONS, completion(n=1000), 400, "n", None),
    ("n-string", CHAT, chat(n="2"), 400, "n", None),
    ("temperature-negative", COMPLETIONS, completion(temperature=-0.5), 400, "temperature", None),
    ("temperature-too-high", CHAT, chat(temperature=2.5), 400, "temperature", None),
    ("temperature-string", CHAT, chat(temperature="hot"), 400, "temperature", None),
    ("top-p-zero", COMPLETIONS, completion(top_p=0), 400, "top_p", None),
    ("top-p-above-one", CHAT, chat(top_p=1.01), 400, "top_p", None),
    ("top-k-below-minus-one", COMPLETIONS, completion(top_k=-2), 400, "top_k", None),
    ("min-p-above-one", COMPLETIONS, completion(min_p=1.5), 400, "min_p", None),
    ("presence-penalty-range", CHAT, chat(presence_penalty=3), 400, "presence_penalty", None),
    (
        "frequency-penalty-range",
        CHAT,
        chat(frequency_penalty=-2.5),
        400,
        "frequency_penalty",
        None,
    ),
    ("too-many-stops", COMPLETIONS, completion(stop=list("abcdefghijklmnopq")), 400, "stop", None),
    ("stop-not-strings", CHAT, chat(stop=[1, 2]), 400, "stop", None),
    ("stop-empty-string", CHAT, chat(stop=[""]), 400, "stop", None),
    ("logprobs-too-many", COMPLETIONS, completion(logprobs=21), 400, "logprobs", None),
    ("logprobs-negative", COMPLETIONS, completion(logprobs=-1), 400, "logprobs", None),
    ("chat-logprobs-not-bool", CHAT, chat(logprobs=3), 400, "logprobs", None),
    (
        "top-logprobs-too-many",
        CHAT,
        chat(logprobs=True, top_logprobs=21),
        400,
        "top_logprobs",
        None,
    ),
    ("top-logprobs-without-logprobs", CHAT, chat(top_logprobs=2), 400, "top_logprobs", None),
    ("logit-bias-out-of-range", CHAT, chat(logit_bias={"100": 200}), 400, "logit_bias", None),
    ("logit-bias-bad-key", COMPLETIONS, completion(logit_bias={"abc": 1}), 400, "logit_bias", None),
    ("logit-bias-id-too-big", CHAT, chat(logit_bias={"999999": 1}), 400, "logit_bias", None),
    ("logit-bias-not-object", CHAT, chat(logit_bias=[1]), 400, "logit_bias", None),
    ("seed-string", COMPLETIONS, completion(seed="x"), 400, "seed", None),
    ("stream-not-bool", COMPLETIONS, completion(stream="yes"), 400, "stream", None),
    (
        "stream-options-without-stream",
        CHAT,
        chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
        None,
    ),
    (
        "include-usage-not-bool",
        CHAT,
        chat(stream=True, stream_options={"include_usage": "yes"}),
        400,
        "stream_options.include_usage",
        None,
    ),
    ("echo-not-bool", COMPLETIONS, completion(echo="no"), 400, "echo", None),
    ("min-tokens-over-max", COMPLETIONS, completion(min_tokens=10), 400, "min_tokens", None),
    ("stop-token-ids-bad", CHAT, chat(stop_token_ids=[-1]), 400, "stop_token_ids", None),
    (
        "tool-without-name",
        CHAT,
        chat(tools=[{"type": "function"}]),
        400,
        "tools[0].function.name",
        None,
    ),
    ("suffix-unsupported", COMPLETIONS, completion(suffix="end"), 400, "suffix", None),
    ("model-wrong-type", CHAT, chat(model=3), 400, "model", None),
    ("unknown-model", COMPLETIONS, completion(model="gpt-9"), 404, "model", "model_not_found"),
    ("unknown-model-chat", CHAT, chat(model="gpt-9"), 404, "model", "model_not_found"),
]


def assert_error_shape(body: Any, *, param: str | None, code: str | None) -> dict[str, Any]:
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["type"], str)
    assert error["param"] == param
    assert error["code"] == code
    return dict(error)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_is_refused_naming_the_field(
    server: Any, path: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    if isinstance(body, bytes):
        response = server.client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
    else:
        response = server.client.post(path, json=body)
    assert response.status_code == status, response.text
    error = assert_error_shape(response.json(), param=param, code=code)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert param.split("[")[0].split(".")[0] in error["message"]


def test_the_table_has_thirty_cases_and_a_good_request_still_succeeds(server: Any) -> None:
    assert len(BAD_REQUESTS) >= 30
    response = server.client.post(COMPLETIONS, json=completion(temperature=0))
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] in {"stop", "length"}
    response = server.client.post(CHAT, json=chat(temperature=0))
    assert response.status_code == 200
    server.wait_idle()


def test_unknown_route_and_wrong_method(server: Any) -> None:
    response = server.client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert_error_shape(response.json(), param=None, code=None)
    response = server.client.get(COMPLETIONS)
    assert response.status_code == 405
    assert_error_shape(response.json(), param=None, code=None)


def test_an_exception_in_a_route_is_a_500_and_the_server_goes_on(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    route = Route("/test-only/broken", broken, methods=["GET"])
    server.app.router.routes.append(route)
    try:
        response = server.client.get("/test-only/broken")
    finally:
        server.app.router.routes.remove(route)
    assert response.status_code == 500
    error = assert_error_shape(response.json(), param=None, code="internal_error")
    assert error["type"] == "server_error"
    # The body names an id to find the failure by in the log, and says nothing of it.
    error_id = response.headers["x-error-id"]
    assert re.fullmatch(r"err-[0-9a-f]{16}", error_id)
    assert error_id in error["message"]
    assert "a bug" not in error["message"]
    assert "RuntimeError" not in error["message"]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged
    assert logged[0].exc_info is not None
    assert "a bug" in str(logged[0].exc_info[1])
    assert server.client.post(COMPLETIONS, json=completion()).status_code == 200


@pytest.mark.parametrize("is_streamed", [False, True])
def test_an_engine_failure_is_a_500_or_an_error_event(
    server: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    is_streamed: bool,
) -> None:
    engine: Engine = server.engine
    original_step = engine.core.step
    num_calls = 0

    def failing_once() -> list[EngineCoreOutput]:
        nonlocal num_calls
        num_calls += 1
        if num_calls == 1:
            raise RuntimeError("injected engine failure")
        return original_step()

    monkeypatch.setattr(engine.core, "step", failing_once)
    response = server.client.post(CHAT, json=chat(stream=is_streamed, max_tokens=8))
    if is_streamed:
        assert response.status_code == 200
        frames = response.content.split(b"\n\n")
        assert frames[-2:] == [b"data: [DONE]", b""]
        error = json.loads(frames[-3].removeprefix(b"data: "))["error"]
    else:
        assert response.status_code == 500
        error = assert_error_shape(response.json(), param=None, code="internal_error")
    assert error["code"] == "internal_error"
    error_id = re.search(r"err-[0-9a-f]{16}", error["message"])
    assert error_id is not None
    assert "injected engine failure" not in error["message"]
    logged = [r.getMessage() for r in caplog.records if error_id[0] in r.getMessage()]
    assert logged
    assert "injected engine failure" in logged[0]
    assert server.client.post(CHAT, json=chat()).status_code == 200
    server.wait_idle()


def test_api_keys_guard_everything_but_health_and_metrics(server: Any) -> None:
    client = server.client
    with server.overridden(api_keys=("first-key", "second-key")):
        missing = client.get("/v1/models")
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        not_bearer = client.get("/v1/models", headers={"Authorization": "Basic second-key"})
        refused_post = client.post(COMPLETIONS, json=completion())
        for response in (missing, wrong, not_bearer, refused_post):
            assert response.status_code == 401
            assert_error_shape(response.json(), param=None, code="invalid_api_key")
        good = {"Authorization": "Bearer second-key"}
        assert client.get("/v1/models", headers=good).status_code == 200
        assert client.post(COMPLETIONS, json=completion(), headers=good).status_code == 200
        for open_path in ("/health", "/health/live", "/metrics"):
            assert client.get(open_path).status_code == 200
    assert client.get("/v1/models").status_code == 200


def test_a_body_over_the_limit_is_413(server: Any) -> None:
    padding = "x" * 5000
    with server.overridden(max_body_bytes=2000):
        declared = server.client.post(COMPLETIONS, json=completion(user=padding))
        assert declared.status_code == 413
        assert_error_shape(declared.json(), param=None, code="request_too_large")

        def chunks() -> Any:
            for _ in range(10):
                yield b" " * 500  # JSON whitespace: only the size can fail this body

        streamed = server.client.post(
            COMPLETIONS, content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413
        assert_error_shape(streamed.json(), param=None, code="request_too_large")
        assert server.client.post(COMPLETIONS, json=completion()).status_code == 200
