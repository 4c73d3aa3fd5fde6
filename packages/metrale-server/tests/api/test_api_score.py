"""``POST /v1/score`` and the rerank routes on a tiny random Qwen3 causal LM served with
``--task score``: each score is sigmoid(logit[yes] - logit[no]) of transformers' last-token
logits on Qwen3-Reranker's prompt; 1:1, 1:N and N:N pairing, the ranking and ``top_n``, and
400s naming the field or the flag."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_model_arch import Tokenizer
from metrale_server import EngineArgs, build_engine
from metrale_server.pooling.model_task import ModelTask
from metrale_server.pooling.params import PoolingParams
from metrale_server.pooling.score_prompt import DEFAULT_INSTRUCTION, score_prompt

from .conftest import RunningServer
from .pooling_checkpoints import save_tiny_reranker

transformers = pytest.importorskip("transformers")

MODEL = "tiny-reranker"
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Bananas are yellow.",
    "The Eiffel Tower is in Paris.",
    "Berlin is in Germany.",
]
ATOL = 1e-5


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return save_tiny_reranker(tmp_path_factory.mktemp("tiny-qwen3-reranker"), default_tokenizer)


@pytest.fixture(scope="module")
def score_server(
    reranker_dir: Path, serve_engine: Callable[..., AbstractContextManager[RunningServer]]
) -> Iterator[RunningServer]:
    args = EngineArgs(model=str(reranker_dir), dtype="float32", max_batch_size=8, task="score")
    with serve_engine(build_engine(args), MODEL) as running:
        yield running
        running.wait_idle()


@pytest.fixture(scope="module")
def reference(reranker_dir: Path, default_tokenizer: Tokenizer) -> Callable[..., tuple[float, int]]:
    """transformers' score of one pair, and its prompt's token count."""
    model = transformers.Qwen3ForCausalLM.from_pretrained(reranker_dir, dtype=torch.float32)
    model.eval()
    (no_id,) = default_tokenizer.encode("no", add_special_tokens=False)
    (yes_id,) = default_tokenizer.encode("yes", add_special_tokens=False)

    def score(
        query: str, document: str, instruction: str = DEFAULT_INSTRUCTION
    ) -> tuple[float, int]:
        text = score_prompt(query, document, instruction)
        token_ids = default_tokenizer.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([token_ids])).logits[0, -1].double()
        return float(torch.sigmoid(logits[yes_id] - logits[no_id])), len(token_ids)

    return score


def post(server: RunningServer, path: str, **body: Any) -> dict[str, Any]:
    response = server.client.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_the_task_reads_yes_and_no(
    score_server: RunningServer, default_tokenizer: Tokenizer
) -> None:
    (no_id,) = default_tokenizer.encode("no", add_special_tokens=False)
    (yes_id,) = default_tokenizer.encode("yes", add_special_tokens=False)
    assert score_server.state.task == ModelTask(
        name="score", pooling=PoolingParams(score_token_ids=(no_id, yes_id))
    )


@pytest.mark.parametrize(
    ("text_1", "text_2", "pairs"),
    [
        (QUERY, DOCUMENTS[0], [(QUERY, DOCUMENTS[0])]),
        (QUERY, DOCUMENTS, [(QUERY, d) for d in DOCUMENTS]),
        ([QUERY], DOCUMENTS[:2], [(QUERY, d) for d in DOCUMENTS[:2]]),
        (["q one", "q two"], DOCUMENTS[:2], [("q one", DOCUMENTS[0]), ("q two", DOCUMENTS[1])]),
    ],
)
def test_scores_match_transformers(
    score_server: RunningServer,
    reference: Callable[..., tuple[float, int]],
    text_1: Any,
    text_2: Any,
    pairs: list[tuple[str, str]],
) -> None:
    body = post(score_server, "/v1/score", text_1=text_1, text_2=text_2)
    assert body["id"].startswith("score-")
    assert (body["object"], body["model"]) == ("list", MODEL)
    expected = [reference(query, document) for query, document in pairs]
    assert [item["index"] for item in body["data"]] == list(range(len(pairs)))
    assert all(item["object"] == "score" for item in body["data"])
    for item, (score, _) in zip(body["data"], expected, strict=True):
        assert math.isclose(item["score"], score, abs_tol=ATOL)
    num_tokens = sum(count for _, count in expected)
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def test_the_instruction_can_be_replaced(
    score_server: RunningServer, reference: Callable[..., tuple[float, int]]
) -> None:
    instruction = "Given a question, find the passage that names a city"
    body = post(
        score_server, "/v1/score", text_1=QUERY, text_2=DOCUMENTS[1], instruction=instruction
    )
    (item,) = body["data"]
    assert math.isclose(item["score"], reference(QUERY, DOCUMENTS[1], instruction)[0], abs_tol=ATOL)
    assert not math.isclose(item["score"], reference(QUERY, DOCUMENTS[1])[0], abs_tol=ATOL)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_sorts_by_score(
    score_server: RunningServer, reference: Callable[..., tuple[float, int]], path: str
) -> None:
    documents: list[Any] = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]
    body = post(score_server, path, query=QUERY, documents=documents)
    assert body["id"].startswith("rerank-")
    assert body["model"] == MODEL
    expected = [reference(QUERY, document) for document in DOCUMENTS]
    order = sorted(range(len(DOCUMENTS)), key=lambda index: -expected[index][0])
    assert [result["index"] for result in body["results"]] == order
    for result in body["results"]:
        index = result["index"]
        assert math.isclose(result["relevance_score"], expected[index][0], abs_tol=ATOL)
        assert result["document"] == {"text": DOCUMENTS[index]}
    assert body["usage"] == {"total_tokens": sum(count for _, count in expected)}


def test_rerank_top_n_and_without_documents(score_server: RunningServer) -> None:
    full = post(score_server, "/v1/rerank", query=QUERY, documents=DOCUMENTS)["results"]
    top = post(
        score_server,
        "/v1/rerank",
        query=QUERY,
        documents=DOCUMENTS,
        top_n=2,
        return_documents=False,
    )
    assert top["results"] == [
        {"index": result["index"], "relevance_score": result["relevance_score"]}
        for result in full[:2]
    ]
    assert (
        top["usage"] == post(score_server, "/v1/rerank", query=QUERY, documents=DOCUMENTS)["usage"]
    )
    past_the_end = post(score_server, "/v1/rerank", query=QUERY, documents=DOCUMENTS, top_n=99)
    assert past_the_end["results"] == full


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/score", {"text_2": "a"}, "text_1", "is required"),
        ("/v1/score", {"text_1": "a", "text_2": []}, "text_2", "must not be empty"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]}, "text_2", "1:1, 1:N or N:N"),
        ("/v1/score", {"text_1": "a", "text_2": [1]}, "text_2", "expected a string or an array"),
        ("/v1/score", {"text_1": "a", "text_2": "x " * 2000}, "text_2", "max_seq_len"),
        ("/v1/score", {"text_1": "a", "text_2": ["b", "x " * 2000]}, "text_2[1]", "max_seq_len"),
        ("/v1/rerank", {"documents": ["a"]}, "query", "is required"),
        ("/v1/rerank", {"query": "a", "documents": []}, "documents", "must not be empty"),
        ("/v1/rerank", {"query": "a", "documents": [3]}, "documents[0]", "expected a string"),
        ("/v1/rerank", {"query": "a", "documents": [{}]}, "documents[0].text", "is required"),
        ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n", "at least 0"),
        ("/v1/rerank", {"query": "a", "documents": ["b"], "rank_fields": ["x"]}, "rank_fields",
         "is not supported"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(
    score_server: RunningServer, path: str, body: dict[str, Any], param: str, message: str
) -> None:
    response = score_server.client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert message in error["message"]


@pytest.mark.parametrize(
    ("path", "task"), [("/v1/embeddings", "embed"), ("/v1/completions", "generate")]
)
def test_routes_of_other_tasks_name_the_flag(
    score_server: RunningServer, path: str, task: str
) -> None:
    response = score_server.client.post(path, json={"input": "a", "prompt": "a"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == (
        f"this model serves task 'score'; start the server with --task {task} for {path}"
    )


def test_a_generative_server_refuses_scores(server: RunningServer) -> None:
    response = server.client.post("/v1/rerank", json={"query": "a", "documents": ["b"]})
    assert response.status_code == 400, response.text
    assert "--task score for /v1/rerank" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/score", "/rerank", "/v2/rerank"])
def test_the_api_key_guards_every_score_path(score_server: RunningServer, path: str) -> None:
    body: dict[str, Any] = (
        {"text_1": "a", "text_2": "b"}
        if path == "/v1/score"
        else {"query": "a", "documents": ["b"]}
    )
    with score_server.overridden(api_keys=("k1",)):
        refused = score_server.client.post(path, json=body)
        allowed = score_server.client.post(path, json=body, headers={"Authorization": "Bearer k1"})
    assert refused.status_code == 401
    assert allowed.status_code == 200, allowed.text
