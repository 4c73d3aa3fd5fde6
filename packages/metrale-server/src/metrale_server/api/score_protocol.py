"""The bodies of ``POST /v1/score`` (vLLM's) and ``POST /v1/rerank`` (Jina's and Cohere's),
parsed and checked: one reranker prompt per (query, document) pair."""

from __future__ import annotations

from typing import Any

import attrs

from metrale_server.api.fields import Fields, describe
from metrale_server.api.pooling import check_num_inputs, encode_input, pooling_prompt
from metrale_server.api.protocol import Prompt, check_model
from metrale_server.engine.client import EngineClient
from metrale_server.pooling.model_task import ModelTask
from metrale_server.pooling.score_prompt import DEFAULT_INSTRUCTION, score_prompt


@attrs.frozen(kw_only=True)
class ScoreRequest:
    """Prompt ``i`` scores pair ``i``."""

    prompts: tuple[Prompt, ...]


@attrs.frozen(kw_only=True)
class RerankRequest:
    """Prompt ``i`` scores ``documents[i]``; ``top_n``: how many results to return, best
    first."""

    prompts: tuple[Prompt, ...]
    documents: tuple[str, ...] = attrs.field(repr=False)
    top_n: int
    return_documents: bool


def parse_score_request(
    body: dict[str, Any], engine: EngineClient, served_model_name: str, task: ModelTask
) -> ScoreRequest:
    """``text_1`` and ``text_2`` (a string or an array of strings each) pair as vLLM pairs
    them: 1:1, 1:N (the one ``text_1`` with each ``text_2``) or N:N (element by element)."""
    fields = Fields(body)
    check_model(fields, served_model_name)
    queries = _texts(fields, "text_1")
    documents = _texts(fields, "text_2")
    if len(queries) > 1 and len(queries) != len(documents):
        fields.fail(
            "text_2",
            f"{len(documents)} texts for the {len(queries)} of text_1: pair them 1:1, 1:N or N:N",
        )
    instruction = _instruction(fields)
    fields.refuse_unread()
    pairs = [
        (
            queries[0] if len(queries) == 1 else queries[index],
            document,
            "text_2" if len(documents) == 1 else f"text_2[{index}]",
        )
        for index, document in enumerate(documents)
    ]
    return ScoreRequest(prompts=_prompts(fields, engine, task, instruction, pairs))


def parse_rerank_request(
    body: dict[str, Any], engine: EngineClient, served_model_name: str, task: ModelTask
) -> RerankRequest:
    """``documents``: strings, or objects with a ``text``; ``top_n`` 0 or absent: all."""
    fields = Fields(body)
    check_model(fields, served_model_name)
    query = fields.read_optional_str("query")
    if query is None:
        fields.fail("query", "is required")
    documents = _documents(fields)
    top_n = fields.read_int("top_n", 0, minimum=0) or len(documents)
    return_documents = fields.read_bool("return_documents", True)
    instruction = _instruction(fields)
    fields.refuse_unread()
    pairs = [(query, document, f"documents[{i}]") for i, document in enumerate(documents)]
    return RerankRequest(
        prompts=_prompts(fields, engine, task, instruction, pairs),
        documents=tuple(documents),
        top_n=min(top_n, len(documents)),
        return_documents=return_documents,
    )


def _prompts(
    fields: Fields,
    engine: EngineClient,
    task: ModelTask,
    instruction: str,
    pairs: list[tuple[str, str, str]],
) -> tuple[Prompt, ...]:
    """One prompt per ``(query, document, param)``; a prompt too long names ``param``."""
    assert task.pooling is not None, "a score task has its pooling"
    prompts = []
    for query, document, param in pairs:
        text = score_prompt(query, document, instruction)
        token_ids = encode_input(fields, param, text, engine, add_special_tokens=False)
        prompts.append(pooling_prompt(text, token_ids, task.pooling))
    return tuple(prompts)


def _texts(fields: Fields, name: str) -> list[str]:
    value = fields.raw(name)
    if value is None:
        fields.fail(name, "is required")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        fields.fail(name, f"expected a string or an array of strings, got {describe(value)}")
    check_num_inputs(fields, name, len(texts))
    return texts


def _documents(fields: Fields) -> list[str]:
    documents = fields.read_list("documents")
    if documents is None:
        fields.fail("documents", "is required")
    check_num_inputs(fields, "documents", len(documents))
    return [_document_text(fields, index, value) for index, value in enumerate(documents)]


def _document_text(fields: Fields, index: int, value: Any) -> str:
    if isinstance(value, str):
        return value
    param = f"documents[{index}]"
    if not isinstance(value, dict):
        fields.fail(param, f"expected a string or an object with a text, got {describe(value)}")
    document = Fields(value, fields.param(f"{param}."))
    text = document.read_optional_str("text")
    if text is None:
        document.fail("text", "is required")
    document.refuse_unread()
    return text


def _instruction(fields: Fields) -> str:
    """The reranker's instruction (Qwen3-Reranker's ``Instruct``); the default fits web
    search."""
    instruction = fields.read_optional_str("instruction")
    return DEFAULT_INSTRUCTION if instruction is None else instruction
