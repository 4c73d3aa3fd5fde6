"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, parsed and checked.

Parsing is complete before anything runs: a request that gets past ``parse_*`` has token ids
and fitted ``SamplingParams`` for each prompt, and every refusal names its field.
"""

from __future__ import annotations

from typing import Any

import attrs

from metrale_model_arch import ChatTemplateError
from metrale_server.api.errors import ApiError, bad_request
from metrale_server.api.fields import Fields, describe, is_int
from metrale_server.api.sampling import parse_sampling, read_logprobs_count
from metrale_server.engine.engine import Engine
from metrale_server.sampling.params import SamplingParams

MAX_PROMPTS = 64
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHAT_ROLES = ("system", "user", "assistant")


@attrs.frozen(kw_only=True)
class Prompt:
    """One prompt ready for the engine; ``text`` is set when it arrived as text."""

    text: str | None = attrs.field(repr=False)
    token_ids: tuple[int, ...] = attrs.field(repr=False)
    params: SamplingParams


@attrs.frozen(kw_only=True)
class StreamOptions:
    is_streamed: bool
    include_usage: bool


@attrs.frozen(kw_only=True)
class CompletionRequest:
    """A legacy completion: several prompts are allowed; choice ``p * n + i`` is prompt ``p``'s
    ``i``-th output. ``num_logprobs`` is ``None`` when logprobs were not asked for."""

    prompts: tuple[Prompt, ...]
    n: int
    stream: StreamOptions
    is_echo: bool
    num_logprobs: int | None


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A chat completion; ``num_top_logprobs`` is ``None`` unless ``logprobs`` is true."""

    prompt: Prompt
    stream: StreamOptions
    num_top_logprobs: int | None


def check_model(fields: Fields, served_model_name: str) -> None:
    """``model`` may be left out; when given it must be the served model."""
    model = fields.read_optional_str("model")
    if model is not None and model != served_model_name:
        raise ApiError(
            404,
            f"the model {model!r} does not exist; this server serves {served_model_name!r}",
            param="model",
            code="model_not_found",
        )


def parse_completion_request(
    body: dict[str, Any], engine: Engine, served_model_name: str
) -> CompletionRequest:
    fields = Fields(body)
    check_model(fields, served_model_name)
    if fields.raw("suffix"):
        fields.fail("suffix", "is not supported")
    num_logprobs = read_logprobs_count(fields, "logprobs")
    is_echo = fields.read_bool("echo", False)
    if is_echo and num_logprobs is not None:
        fields.fail(
            "echo", "echo with logprobs is not supported (prompt logprobs are not computed)"
        )
    stream = _stream_options(fields)
    sampling = parse_sampling(
        fields,
        engine,
        max_tokens_names=("max_tokens",),
        default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        logprobs=num_logprobs,
    )
    prompts = tuple(
        Prompt(
            text=text,
            token_ids=token_ids,
            params=sampling.fit(len(token_ids), engine, prompt_param="prompt"),
        )
        for text, token_ids in _read_prompts(fields, engine)
    )
    return CompletionRequest(
        prompts=prompts,
        n=sampling.params.n,
        stream=stream,
        is_echo=is_echo,
        num_logprobs=num_logprobs,
    )


def parse_chat_request(body: dict[str, Any], engine: Engine, served_model_name: str) -> ChatRequest:
    fields = Fields(body)
    check_model(fields, served_model_name)
    _refuse_tools(fields)
    messages = read_messages(fields)
    wants_logprobs = fields.read_bool("logprobs", False)
    num_top_logprobs = read_logprobs_count(fields, "top_logprobs")
    if num_top_logprobs and not wants_logprobs:
        fields.fail("top_logprobs", "needs logprobs set to true")
    if wants_logprobs and num_top_logprobs is None:
        num_top_logprobs = 0
    if not wants_logprobs:
        num_top_logprobs = None
    stream = _stream_options(fields)
    sampling = parse_sampling(
        fields,
        engine,
        max_tokens_names=("max_completion_tokens", "max_tokens"),
        default_max_tokens=None,
        logprobs=num_top_logprobs,
    )
    text = render_messages(
        engine, messages, add_generation_prompt=fields.read_bool("add_generation_prompt", True)
    )
    token_ids = tuple(engine.loaded.tokenizer.encode(text, add_special_tokens=False))
    if not token_ids:
        fields.fail("messages", "the rendered conversation is empty")
    prompt = Prompt(
        text=text,
        token_ids=token_ids,
        params=sampling.fit(len(token_ids), engine, prompt_param="messages"),
    )
    return ChatRequest(prompt=prompt, stream=stream, num_top_logprobs=num_top_logprobs)


def render_messages(
    engine: Engine, messages: list[dict[str, Any]], *, add_generation_prompt: bool
) -> str:
    """The prompt text of ``messages`` under the model's chat template."""
    try:
        return engine.loaded.render_chat(messages, add_generation_prompt=add_generation_prompt)
    except ChatTemplateError as error:
        raise bad_request(str(error), param="messages") from error


def read_messages(fields: Fields) -> list[dict[str, Any]]:
    """``messages`` as the chat template takes them: role, content (text or text parts), name."""
    value = fields.read_list("messages")
    if value is None:
        fields.fail("messages", "is required")
    if not value:
        fields.fail("messages", "must not be empty")
    messages = []
    for index, message in enumerate(value):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"{param}: expected an object, got {describe(message)}", param=param)
        item = Fields(message, f"{param}.")
        role = message.get("role")
        if role not in CHAT_ROLES:
            item.fail("role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        parsed: dict[str, Any] = {"role": role, "content": _read_content(item, content)}
        name = item.read_optional_str("name")
        if name is not None:
            parsed["name"] = name
        messages.append(parsed)
    return messages


def _read_content(item: Fields, content: object) -> str | list[dict[str, str]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        item.fail("content", f"expected a string or an array of parts, got {describe(content)}")
    parts = []
    for index, part in enumerate(content):
        param = f"content[{index}]"
        if not isinstance(part, dict):
            item.fail(param, f"expected an object, got {describe(part)}")
        if part.get("type") != "text":
            item.fail(f"{param}.type", f"only text parts are supported, got {part.get('type')!r}")
        if not isinstance(part.get("text"), str):
            item.fail(f"{param}.text", "expected a string")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _read_prompts(fields: Fields, engine: Engine) -> list[tuple[str | None, tuple[int, ...]]]:
    value = fields.raw("prompt")
    if value is None:
        fields.fail("prompt", "is required")
    is_one_token_list = isinstance(value, list) and bool(value) and all(map(is_int, value))
    items = [value] if isinstance(value, str) or is_one_token_list else value
    if not isinstance(items, list) or not all(isinstance(i, str | list) for i in items):
        fields.fail(
            "prompt",
            "expected a string, an array of token ids, or an array of either, "
            f"got {describe(value)}",
        )
    if not items:
        fields.fail("prompt", "must not be empty")
    if len(items) > MAX_PROMPTS:
        fields.fail("prompt", f"at most {MAX_PROMPTS} prompts, got {len(items)}")
    tokenizer = engine.loaded.tokenizer
    vocab_size = engine.loaded.config.vocab_size
    prompts: list[tuple[str | None, tuple[int, ...]]] = []
    for item in items:
        if isinstance(item, str):
            prompts.append((item, tuple(tokenizer.encode(item, add_special_tokens=True))))
        elif all(is_int(t) and 0 <= t < vocab_size for t in item):
            prompts.append((None, tuple(item)))
        else:
            fields.fail("prompt", f"token ids must be integers in 0..{vocab_size - 1}")
        if not prompts[-1][1]:
            fields.fail("prompt", "must not be empty")
    return prompts


def _stream_options(fields: Fields) -> StreamOptions:
    is_streamed = fields.read_bool("stream", False)
    options = fields.read_object("stream_options")
    if options.body and not is_streamed:
        fields.fail("stream_options", "is only allowed when stream is true")
    return StreamOptions(
        is_streamed=is_streamed, include_usage=options.read_bool("include_usage", False)
    )


def _refuse_tools(fields: Fields) -> None:
    if fields.raw("tools") or fields.raw("functions"):
        fields.fail(
            "tools" if fields.raw("tools") else "functions", "tool calling is not supported"
        )
    if fields.raw("tool_choice") not in (None, "none", "auto"):
        fields.fail("tool_choice", "tool calling is not supported")
    response_format = fields.read_object("response_format")
    if response_format.read_optional_str("type") not in (None, "text"):
        response_format.fail("type", "only the text response format is supported")
