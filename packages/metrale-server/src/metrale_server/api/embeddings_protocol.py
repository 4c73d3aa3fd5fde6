"""The body of ``POST /v1/embeddings`` (OpenAI's), parsed and checked: one prompt per input."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from metrale_server.api.fields import Fields, describe, is_int
from metrale_server.api.pooling import (
    check_input_tokens,
    check_num_inputs,
    encode_input,
    pooling_prompt,
)
from metrale_server.api.protocol import Prompt, check_model
from metrale_server.engine.client import EngineClient
from metrale_server.pooling.model_task import ModelTask

EncodingFormat = Literal["float", "base64"]
ENCODING_FORMATS: tuple[EncodingFormat, ...] = ("float", "base64")


@attrs.frozen(kw_only=True)
class EmbeddingRequest:
    """``base64``: each vector's little-endian float32 bytes, base64-encoded (what the openai
    SDK asks for by default)."""

    prompts: tuple[Prompt, ...]
    encoding_format: EncodingFormat


def parse_embedding_request(
    body: dict[str, Any], engine: EngineClient, served_model_name: str, task: ModelTask
) -> EmbeddingRequest:
    assert task.pooling is not None, "an embed task has its pooling"
    fields = Fields(body)
    check_model(fields, served_model_name)
    encoding_format = _encoding_format(fields)
    dimensions = _dimensions(fields, task, engine.info.config.hidden_size)
    fields.read_optional_str("user")  # accepted, as OpenAI's clients send it; not used
    add_special_tokens = fields.read_bool("add_special_tokens", True)
    inputs = _read_inputs(fields, engine, add_special_tokens=add_special_tokens)
    fields.refuse_unread()
    pooling = attrs.evolve(task.pooling, dimensions=dimensions)
    return EmbeddingRequest(
        prompts=tuple(pooling_prompt(text, token_ids, pooling) for text, token_ids in inputs),
        encoding_format=encoding_format,
    )


def _encoding_format(fields: Fields) -> EncodingFormat:
    value = fields.read_optional_str("encoding_format") or "float"
    for name in ENCODING_FORMATS:
        if value == name:
            return name
    fields.fail("encoding_format", f"must be one of {', '.join(ENCODING_FORMATS)}, got {value!r}")


def _dimensions(fields: Fields, task: ModelTask, hidden_size: int) -> int | None:
    """The length asked for, allowed only for a Matryoshka model (its config says so)."""
    dimensions = fields.read_optional_int("dimensions", minimum=1, maximum=hidden_size)
    if dimensions is None:
        return None
    if not task.is_matryoshka:
        fields.fail(
            "dimensions",
            "this model is not a Matryoshka model (its config.json sets neither is_matryoshka "
            f"nor matryoshka_dimensions), so its embeddings are {hidden_size} long; leave "
            "dimensions out",
        )
    listed = task.matryoshka_dimensions
    if listed and dimensions not in listed:
        fields.fail("dimensions", f"must be one of {', '.join(map(str, listed))}, got {dimensions}")
    return dimensions


def _read_inputs(
    fields: Fields, engine: EngineClient, *, add_special_tokens: bool
) -> list[tuple[str | None, tuple[int, ...]]]:
    """``input``: a string, an array of token ids, or an array of either; each is checked and
    named ``input[i]`` in errors when there are several."""
    value = fields.raw("input")
    if value is None:
        fields.fail("input", "is required")
    is_one_token_list = isinstance(value, list) and bool(value) and all(map(is_int, value))
    is_one = isinstance(value, str) or is_one_token_list
    items = [value] if is_one else value
    if not isinstance(items, list) or not all(isinstance(i, str | list) for i in items):
        fields.fail(
            "input",
            "expected a string, an array of token ids, or an array of either, "
            f"got {describe(value)}",
        )
    check_num_inputs(fields, "input", len(items))
    vocab_size = engine.info.config.vocab_size
    inputs: list[tuple[str | None, tuple[int, ...]]] = []
    for index, item in enumerate(items):
        param = "input" if is_one else f"input[{index}]"
        if isinstance(item, str):
            token_ids = encode_input(
                fields, param, item, engine, add_special_tokens=add_special_tokens
            )
            inputs.append((item, token_ids))
        elif all(is_int(t) and 0 <= t < vocab_size for t in item):
            inputs.append((None, check_input_tokens(fields, param, tuple(item), engine)))
        else:
            fields.fail(param, f"token ids must be integers in 0..{vocab_size - 1}")
    return inputs
