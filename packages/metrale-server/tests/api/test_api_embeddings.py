"""``POST /v1/embeddings`` on a tiny random Qwen3 embedding model (Qwen3-Embedding's layout,
detected by ``--task auto``), through the official ``openai`` client: vectors equal to
transformers' pooled states, the same alone as batched, token-id inputs, Matryoshka
``dimensions``, other pooling methods, 400s naming the field, and the task checks between
the embedding and the generation routes."""

from __future__ import annotations

import base64
import logging
import struct
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from metrale_model_arch import Tokenizer
from metrale_server import EngineArgs, build_engine
from metrale_server.api.embeddings import encode_vector
from metrale_server.cli.serve_args import ServeArgs
from metrale_server.cli.serve_runtime import log_boot
from metrale_server.pooling.model_task import ModelTask
from metrale_server.pooling.params import PoolingMethod, PoolingParams

from .conftest import RunningServer
from .pooling_checkpoints import save_tiny_embedding_model

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

MODEL = "tiny-embed"
TEXTS = ["The cat sat on the mat.", "A quick brown fox", "embeddings, one by one: 1 2 3"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return save_tiny_embedding_model(tmp_path_factory.mktemp("tiny-qwen3-embed"), default_tokenizer)


@pytest.fixture(scope="module")
def embed_server(
    embed_dir: Path, serve_engine: Callable[..., AbstractContextManager[RunningServer]]
) -> Iterator[RunningServer]:
    engine = build_engine(EngineArgs(model=str(embed_dir), dtype="float32", max_batch_size=8))
    with serve_engine(engine, MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def reference(embed_dir: Path) -> Callable[[list[int]], torch.Tensor]:
    """transformers' final hidden states (positions x hidden) of one prompt, in float32."""
    model = transformers.Qwen3Model.from_pretrained(embed_dir, dtype=torch.float32).eval()

    def hidden(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            states = model(input_ids=torch.tensor([token_ids])).last_hidden_state
        return states[0].float()

    return hidden


@pytest.fixture
def client(embed_server: RunningServer) -> Iterator[Any]:
    with openai.OpenAI(
        base_url=f"{embed_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as sdk:
        yield sdk
    embed_server.wait_idle()


def token_ids(text: str, tokenizer: Tokenizer) -> list[int]:
    """The ids the server embeds for ``text``: the tokenizer's, special tokens included."""
    return tokenizer.encode(text, add_special_tokens=True)


def expected(hidden: torch.Tensor, *, dimensions: int | None = None) -> torch.Tensor:
    """Last-token pooling, cut to ``dimensions``, then L2-normalized."""
    vector = hidden[-1][:dimensions]
    return vector / vector.norm()


def as_tensor(embedding: Any) -> torch.Tensor:
    return torch.tensor(embedding.embedding, dtype=torch.float32)


def post(server: RunningServer, **body: Any) -> Any:
    return server.client.post("/v1/embeddings", json={"model": MODEL, **body})


def test_the_embedding_layout_is_served_as_embed(embed_server: RunningServer) -> None:
    assert embed_server.state.task == ModelTask(
        name="embed", pooling=PoolingParams(method="last", normalize=True), is_matryoshka=True
    )
    assert embed_server.client.get("/v1/server").json()["task"] == "embed"


def test_the_boot_log_names_the_task(
    embed_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    args = ServeArgs(engine_args=embed_server.engine.args, served_model_name=MODEL)
    with caplog.at_level(logging.INFO, logger="metrale.serve"):
        log_boot(embed_server.engine, args)
    expected_line = "task: embed (last-token pooling, normalized, Matryoshka dimensions: any)"
    assert expected_line in caplog.messages


# None: the SDK's default, base64, which it decodes itself.
@pytest.mark.parametrize("encoding_format", [None, "float"])
def test_sdk_embeddings_match_transformers(
    client: Any,
    reference: Callable[[list[int]], torch.Tensor],
    default_tokenizer: Tokenizer,
    encoding_format: str | None,
) -> None:
    extra = {} if encoding_format is None else {"encoding_format": encoding_format}
    response = client.embeddings.create(model=MODEL, input=TEXTS, **extra)
    assert response.model == MODEL
    assert [item.index for item in response.data] == [0, 1, 2]
    ids = [token_ids(text, default_tokenizer) for text in TEXTS]
    for item, prompt_ids in zip(response.data, ids, strict=True):
        assert item.object == "embedding"
        torch.testing.assert_close(
            as_tensor(item), expected(reference(prompt_ids)), atol=ATOL, rtol=0
        )
    num_tokens = sum(map(len, ids))
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (num_tokens, num_tokens)


def test_base64_is_the_float_vector_as_little_endian_float32(embed_server: RunningServer) -> None:
    floats = post(embed_server, input=TEXTS[0]).json()["data"][0]["embedding"]
    encoded = post(embed_server, input=TEXTS[0], encoding_format="base64").json()
    raw = base64.b64decode(encoded["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == floats
    assert (
        encode_vector([1.0, -0.5], "base64")
        == base64.b64encode(b"\x00\x00\x80\x3f\x00\x00\x00\xbf").decode()
    )


def test_a_vector_is_the_same_alone_and_batched(client: Any) -> None:
    together = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float").data
    for text, batched in zip(TEXTS, together, strict=True):
        (alone,) = client.embeddings.create(model=MODEL, input=text, encoding_format="float").data
        assert alone.embedding == batched.embedding


def test_token_id_inputs_embed_like_their_text(client: Any, default_tokenizer: Tokenizer) -> None:
    by_text = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float").data
    ids = [token_ids(text, default_tokenizer) for text in TEXTS]
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float").data
    (one,) = client.embeddings.create(model=MODEL, input=ids[1], encoding_format="float").data
    assert [item.embedding for item in by_ids] == [item.embedding for item in by_text]
    assert one.embedding == by_text[1].embedding


def test_matryoshka_dimensions_cut_then_normalize(
    client: Any, reference: Callable[[list[int]], torch.Tensor], default_tokenizer: Tokenizer
) -> None:
    response = client.embeddings.create(model=MODEL, input=TEXTS[:2], dimensions=16)
    for item, text in zip(response.data, TEXTS, strict=False):
        hidden = reference(token_ids(text, default_tokenizer))
        assert len(item.embedding) == 16
        torch.testing.assert_close(
            as_tensor(item), expected(hidden, dimensions=16), atol=ATOL, rtol=0
        )


@pytest.mark.parametrize(
    ("task_fields", "dimensions", "message"),
    [
        ({"is_matryoshka": False}, 16, "is not a Matryoshka model"),
        ({}, 65, "must be at most 64"),
        ({}, 0, "must be at least 1"),
        ({"matryoshka_dimensions": (16, 32)}, 24, "must be one of 16, 32, got 24"),
    ],
)
def test_dimensions_the_model_cannot_give_are_refused(
    embed_server: RunningServer, task_fields: dict[str, Any], dimensions: int, message: str
) -> None:
    task = attrs.evolve(embed_server.state.task, **task_fields)
    with embed_server.overridden(task=task):
        response = post(embed_server, input="hi", dimensions=dimensions)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "dimensions"
    assert message in error["message"]


@pytest.mark.parametrize(("method", "normalize"), [("mean", False), ("mean", True), ("cls", False)])
def test_mean_and_cls_pooling(
    embed_server: RunningServer,
    reference: Callable[[list[int]], torch.Tensor],
    default_tokenizer: Tokenizer,
    method: PoolingMethod,
    normalize: bool,
) -> None:
    task = ModelTask(name="embed", pooling=PoolingParams(method=method, normalize=normalize))
    with embed_server.overridden(task=task):
        response = post(embed_server, input=TEXTS, encoding_format="float")
    assert response.status_code == 200, response.text
    for item, text in zip(response.json()["data"], TEXTS, strict=True):
        hidden = reference(token_ids(text, default_tokenizer))
        vector = hidden.mean(dim=0) if method == "mean" else hidden[0]
        if normalize:
            vector = vector / vector.norm()
        got = torch.tensor(item["embedding"])
        torch.testing.assert_close(got, vector, atol=ATOL, rtol=0)
    embed_server.wait_idle()


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "input", "is required"),
        ({"input": []}, "input", "must not be empty"),
        ({"input": ""}, "input", "must not be empty"),
        ({"input": ["a", ""]}, "input[1]", "must not be empty"),
        ({"input": [[5, 6], []]}, "input[1]", "must not be empty"),
        ({"input": [1, 2, 10**6]}, "input", "token ids must be integers in 0..49151"),
        ({"input": {"text": "a"}}, "input", "expected a string, an array of token ids"),
        ({"input": [5] * 257}, "input", "has 257 tokens; the model's max_seq_len is 256"),
        ({"input": ["a", [5] * 300]}, "input[1]", "has 300 tokens"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "must be one of"),
        ({"input": "a", "normalize": False}, "normalize", "is not supported"),
    ],
)
def test_bad_requests_name_the_field(
    embed_server: RunningServer, body: dict[str, Any], param: str, message: str
) -> None:
    response = post(embed_server, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message in error["message"]


def test_the_longest_input_that_fits_is_embedded(embed_server: RunningServer) -> None:
    """A pooling request writes nothing after its prompt: the whole context is its."""
    response = post(embed_server, input=[5] * 256, user="someone")
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 256


def test_another_model_name_is_a_404(embed_server: RunningServer) -> None:
    response = embed_server.client.post("/v1/embeddings", json={"model": "x", "input": "a"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "path", ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"]
)
def test_generation_routes_refuse_an_embedding_model(
    embed_server: RunningServer, path: str
) -> None:
    response = embed_server.client.post(path, json={"model": MODEL, "prompt": "hi"})
    assert response.status_code == 400, response.text
    body = response.json()
    message = body["error"]["message"]
    assert message == (
        f"this model serves task 'embed'; start the server with --task generate for {path}"
    )
    if path == "/v1/messages":
        assert body["type"] == "error"  # Anthropic's shape on its path


@pytest.mark.parametrize("path", ["/v1/score", "/v1/rerank", "/rerank", "/v2/rerank"])
def test_score_routes_refuse_an_embedding_model(embed_server: RunningServer, path: str) -> None:
    response = embed_server.client.post(path, json={"query": "a", "documents": ["b"]})
    assert response.status_code == 400, response.text
    assert "--task score" in response.json()["error"]["message"]


def test_a_generative_model_refuses_embeddings(server: RunningServer) -> None:
    response = server.client.post("/v1/embeddings", json={"input": "hi"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == (
        "this model serves task 'generate'; start the server with --task embed for /v1/embeddings"
    )
