"""What a web page or a client with a valid key must not be able to do to the server: read it
from another site, rebind a name onto it, make one request unbounded work, fill the queue
without a 429, learn its paths or its failures. Each case leaves the server serving and idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import llguidance
import pytest

from metrale_model_arch import Tokenizer
from metrale_server import EngineArgs, build_engine
from metrale_server.api import inert_fields, structured_fields
from metrale_server.api.misc_routes import TOKENIZE_CONTEXTS
from metrale_server.api.request_guard import LOOPBACK_HOSTS, default_allowed_hosts, host_name
from metrale_server.structured import compiler as compiler_module

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODEL = "tiny-llama"


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hello there", "max_tokens": 2, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hi"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2, **extra}


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


# -- a web page on another site --------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_post_body_not_declared_json_is_415(server: Any, content_type: str | None) -> None:
    """A page may send a "simple" cross-site POST (text/plain, a form) without asking; a JSON
    one it may not. The body here is valid JSON: only its declared type is refused."""
    headers = {} if content_type is None else {"content-type": content_type}
    body = b'{"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2}'
    response = server.client.post(COMPLETIONS, content=body, headers=headers)
    error = error_of(response, 415)
    assert error["code"] == "unsupported_media_type"
    charset = {"content-type": "application/json; charset=utf-8"}
    assert server.client.post(COMPLETIONS, content=body, headers=charset).status_code == 200
    server.wait_idle()


def test_a_rebound_host_name_is_400(server: Any) -> None:
    loopback = default_allowed_hosts("127.0.0.1")
    with server.overridden(allowed_hosts=loopback):
        evil = server.client.get("/v1/models", headers={"host": "evil.example:8888"})
        assert error_of(evil, 400)["code"] == "invalid_host"
        post = server.client.post(
            COMPLETIONS, json=completion(), headers={"host": "rebind.attacker.test"}
        )
        error_of(post, 400)
        for host in ("localhost:8888", "127.0.0.1", "[::1]:8888", "LOCALHOST"):
            assert server.client.get("/v1/models", headers={"host": host}).status_code == 200
    assert server.client.get("/v1/models", headers={"host": "evil.example"}).status_code == 200


def test_the_default_hosts_follow_the_bind_address() -> None:
    assert default_allowed_hosts("127.0.0.1") == LOOPBACK_HOSTS
    assert default_allowed_hosts("[::1]") == LOOPBACK_HOSTS
    assert default_allowed_hosts("127.0.0.2") == LOOPBACK_HOSTS | {"127.0.0.2"}
    assert default_allowed_hosts("0.0.0.0") is None
    assert default_allowed_hosts("10.1.2.3") is None
    assert host_name("[::1]:8888") == "::1"
    assert host_name("Example.COM:80") == "example.com"


def test_no_origin_may_read_the_api_by_default(server: Any) -> None:
    origin = {"origin": "https://evil.example"}
    response = server.client.get("/v1/models", headers=origin)
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers
    preflight = server.client.options(
        COMPLETIONS,
        headers={**origin, "access-control-request-method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


@pytest.fixture(scope="module")
def cors_server(
    tiny_model_dir: Path, serve_engine: Callable[..., AbstractContextManager[Any]]
) -> Iterator[Any]:
    engine = build_engine(EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=4))
    with serve_engine(engine, MODEL, allowed_origins=("https://app.example",)) as running:
        yield running


def test_cors_answers_only_the_allowed_origins(cors_server: Any) -> None:
    def preflight(origin: str) -> httpx.Response:
        return cors_server.client.options(
            CHAT,
            headers={
                "origin": origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type",
            },
        )

    allowed = preflight("https://app.example")
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    refused = preflight("https://evil.example")
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers
    reply = cors_server.client.post(CHAT, json=chat(), headers={"origin": "https://app.example"})
    assert reply.status_code == 200
    assert reply.headers["access-control-allow-origin"] == "https://app.example"


# -- what the server says about itself ---------------------------------------------------------


def test_observability_can_be_put_behind_the_key(server: Any) -> None:
    key = {"Authorization": "Bearer k1"}
    with server.overridden(api_keys=("k1",), protect_observability=True):
        for path in ("/metrics", "/memory"):
            error_of(server.client.get(path), 401)
            assert server.client.get(path, headers=key).status_code == 200
        for path in ("/health", "/health/live"):
            assert server.client.get(path).status_code == 200
    with server.overridden(api_keys=("k1",)):
        assert server.client.get("/metrics").status_code == 200


def test_models_name_no_absolute_path(server: Any) -> None:
    card = server.client.get("/v1/models").json()["data"][0]
    assert "/" not in card["root"]
    assert card["root"] == server.engine.loaded.source.path.name


# -- bounded work per request ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (completion(logit_bias={str(i): 1.0 for i in range(301)}), "logit_bias"),
        (completion(stop_token_ids=list(range(257))), "stop_token_ids"),
        (completion(stop=["x" * 1001]), "stop"),
        (completion(prompt=["Hello"] * 64, n=5), "n"),
        (chat(chat_template_kwargs={"self": 1}), "chat_template_kwargs.self"),
        (chat(chat_template_kwargs={"raise_exception": 1}), "chat_template_kwargs.raise_exception"),
        (chat(chat_template_kwargs={"bos_token": "<evil>"}), "chat_template_kwargs.bos_token"),
        (chat(chat_template_kwargs={"messages": []}), "chat_template_kwargs.messages"),
        (chat(chat_template_kwargs={"__class__": 1}), "chat_template_kwargs.__class__"),
    ],
)
def test_unbounded_asks_are_400_naming_the_field(
    server: Any, body: dict[str, Any], param: str
) -> None:
    path = CHAT if "messages" in body else COMPLETIONS
    error = error_of(server.client.post(path, json=body), 400)
    assert error["param"] == param
    server.wait_idle()


def test_the_bounds_themselves_are_served(server: Any) -> None:
    bias = completion(logit_bias={str(i): 1.0 for i in range(300)})
    assert server.client.post(COMPLETIONS, json=bias).status_code == 200
    ids = completion(stop_token_ids=list(range(256)), ignore_eos=True)
    assert server.client.post(COMPLETIONS, json=ids).status_code == 200
    kwargs = chat(chat_template_kwargs={"enable_thinking": False})
    assert server.client.post(CHAT, json=kwargs).status_code == 200
    server.wait_idle()


def test_a_text_too_long_for_max_seq_len_is_refused_before_tokenizing(server: Any) -> None:
    engine = server.engine
    limit = engine.max_seq_len * engine.loaded.tokenizer.max_token_bytes()
    text = "a" * (limit + 1)
    # /tokenize counts texts of several contexts (to chunk them), up to TOKENIZE_CONTEXTS.
    counted = {"model": MODEL, "prompt": "a" * limit * TOKENIZE_CONTEXTS}
    too_long = {"model": MODEL, "prompt": "a" * (limit * TOKENIZE_CONTEXTS + 1)}
    with server.overridden(max_body_bytes=4 * TOKENIZE_CONTEXTS * limit):
        assert server.client.post("/tokenize", json=counted).status_code == 200
        for path, body in (
            (COMPLETIONS, completion(prompt=text)),
            (CHAT, chat(messages=[{"role": "user", "content": text}])),
            ("/tokenize", too_long),
        ):
            started = time.monotonic()
            error = error_of(server.client.post(path, json=body), 400)
            assert "max_seq_len" in error["message"], error
            assert time.monotonic() - started < 5
    server.wait_idle()


def test_a_full_queue_is_429_with_retry_after(server: Any) -> None:
    with server.overridden(max_queued_requests=2):
        full = server.client.post(COMPLETIONS, json=completion(prompt=["a", "b", "c"]))
        error = error_of(full, 429)
        assert error["code"] == "queue_full"
        assert error["type"] == "rate_limit_error"
        assert int(full.headers["retry-after"]) >= 1
        fits = server.client.post(COMPLETIONS, json=completion(prompt=["a", "b"]))
        assert fits.status_code == 200
    server.wait_idle()


SLOW_ENCODE_S = 1.0


def test_a_slow_tokenization_leaves_the_event_loop_free(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendering and tokenizing run on the preparation threads: while one takes a second,
    /health answers at once (on the event loop it waited the whole second)."""
    encode = Tokenizer.encode

    def slow_encode(self: Tokenizer, text: str, *, add_special_tokens: bool = True) -> list[int]:
        time.sleep(SLOW_ENCODE_S)
        return encode(self, text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(Tokenizer, "encode", slow_encode)
    health_s: list[float] = []
    done = threading.Event()

    def tokenize() -> None:
        try:
            body = {"model": MODEL, "prompt": "Hello there"}
            assert httpx.post(f"{server.base_url}/tokenize", json=body).status_code == 200
        finally:
            done.set()

    worker = threading.Thread(target=tokenize)
    started = time.monotonic()
    worker.start()
    time.sleep(0.1)
    while not done.is_set():
        asked = time.monotonic()
        assert server.client.get("/health").status_code == 200
        health_s.append(time.monotonic() - asked)
        time.sleep(0.02)
    worker.join()
    assert time.monotonic() - started >= SLOW_ENCODE_S
    assert len(health_s) >= 5
    assert max(health_s) < SLOW_ENCODE_S / 4, health_s


# -- fields that change nothing ----------------------------------------------------------------

INERT = {
    "user": "user-42",
    "store": False,
    "metadata": {"team": "search"},
    "service_tier": "auto",
    "prompt_cache_key": "k",
    "safety_identifier": "s",
}


def test_fields_that_change_nothing_are_accepted_and_logged_once(
    server: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inert_fields, "_logged", set())  # as in a fresh process
    caplog.set_level("INFO", logger="metrale_server.api.inert_fields")
    greedy = {"temperature": 0.0, "max_tokens": 4}
    plain = server.client.post(CHAT, json=chat(**greedy))
    for _ in range(2):
        with_fields = server.client.post(CHAT, json=chat(**greedy, **INERT))
        assert with_fields.status_code == 200, with_fields.text
        assert with_fields.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    assert server.client.post(COMPLETIONS, json=completion(**INERT)).status_code == 200
    for name in INERT:
        logged = [r for r in caplog.records if repr(name) in r.getMessage()]
        assert len(logged) == 1, name
    server.wait_idle()


@pytest.mark.parametrize(
    ("name", "value"), [("store", "yes"), ("metadata", []), ("user", 7), ("service_tier", True)]
)
def test_an_inert_field_of_the_wrong_type_is_400(server: Any, name: str, value: Any) -> None:
    assert error_of(server.client.post(CHAT, json=chat(**{name: value})), 400)["param"] == name


def test_a_field_that_would_change_the_output_is_still_400(server: Any) -> None:
    error = error_of(server.client.post(CHAT, json=chat(prediction={"type": "content"})), 400)
    assert error["param"] == "prediction"


# -- grammars ----------------------------------------------------------------------------------


def test_a_constraint_past_the_size_bound_is_400(server: Any) -> None:
    properties = {f"field_{i}": {"type": "integer"} for i in range(10_000)}
    schema = {"type": "object", "properties": properties, "required": list(properties)[:5]}
    body = chat(
        response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    )
    started = time.monotonic()
    error = error_of(server.client.post(CHAT, json=body), 400)
    assert error["param"] == "response_format.json_schema.schema"
    assert "at most 120000" in error["message"]
    assert time.monotonic() - started < 2
    regex = completion(structured_outputs={"regex": "a" * 120_001})
    assert error_of(server.client.post(COMPLETIONS, json=regex), 400)["param"] == (
        "structured_outputs.regex"
    )
    server.wait_idle()


def test_a_grammar_compile_past_its_budget_is_400(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = server.engine.core.grammar_compiler
    compile_grammar = type(compiler).compile

    def slow_compile(self: Any, params: Any) -> Any:
        time.sleep(1.0)
        return compile_grammar(self, params)

    monkeypatch.setattr(structured_fields, "GRAMMAR_COMPILE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(type(compiler), "compile", slow_compile)
    body = completion(structured_outputs={"regex": "[0-9]{3}-slow"})
    error = error_of(server.client.post(COMPLETIONS, json=body), 400)
    assert error["code"] == "prepare_timeout"
    assert error["param"] == "structured_outputs.regex"
    assert server.client.get("/health").status_code == 200
    server.wait_idle()


def test_a_grammar_past_the_grammar_engines_limits_fails_its_request_with_a_400(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit llguidance hits while consuming a token (its mask allowed the token) ends the
    request with a 400 saying so, never a silent ``stop``; the server goes on."""
    tight = llguidance.LLParserLimits(max_items_in_row=50, verbose_errors=False)
    monkeypatch.setattr(compiler_module, "PARSER_LIMITS", tight)
    properties = {f"limit_{i}": {"type": "integer"} for i in range(40)}
    schema = {"type": "object", "properties": properties}
    # The object is opened with '{"' (a random model may close it at once with "{}").
    [open_key] = server.engine.loaded.tokenizer.encode('{"', add_special_tokens=False)
    body = chat(
        max_tokens=8,
        logit_bias={str(open_key): 100},
        response_format={"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}},
    )
    error = error_of(server.client.post(CHAT, json=body), 400)
    assert error["code"] == "request_failed"
    assert "too complex for the grammar engine" in error["message"]
    assert "max is 50" in error["message"]
    assert server.client.post(CHAT, json=chat()).status_code == 200
    server.wait_idle()
