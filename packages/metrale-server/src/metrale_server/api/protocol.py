"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, parsed and checked.

Parsing is complete before anything runs: a request that gets past ``parse_*`` has token ids
and fitted ``SamplingParams`` for each prompt, and every refusal names its field.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from metrale_model_arch import ChatTemplateError, Tokenizer
from metrale_server.api.chat_messages import read_messages
from metrale_server.api.errors import ApiError, bad_request
from metrale_server.api.fields import Fields, describe, is_int
from metrale_server.api.image_parts import ImageSource, prepare_images
from metrale_server.api.inert_fields import accept_inert_fields
from metrale_server.api.sampling import parse_sampling, read_logprobs_count
from metrale_server.api.structured_fields import StructuredRequest, read_structured_outputs
from metrale_server.api.tool_fields import ToolRequest, read_tool_request
from metrale_server.engine.client import EngineClient
from metrale_server.engine.prompt_image import PromptImage, images_in_prompt
from metrale_server.image_limits import ImageLimits
from metrale_server.parsers import SPECIAL_TOKEN_FORMATS
from metrale_server.sampling.params import SamplingParams

MAX_PROMPTS = 64
DEFAULT_IMAGE_LIMITS = ImageLimits()
MAX_SEQUENCES_PER_REQUEST = 256  # prompts x n
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@attrs.frozen(kw_only=True)
class Prompt:
    """One prompt ready for the engine; ``text`` is set when it arrived as text."""

    text: str | None = attrs.field(repr=False)
    token_ids: tuple[int, ...] = attrs.field(repr=False)
    params: SamplingParams
    # Where the prompt's images stand (its image tokens expanded in ``token_ids``).
    images: tuple[PromptImage, ...] = attrs.field(default=(), repr=False)


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
    structured: StructuredRequest | None
    # Asked for with vLLM's ``prompt_logprobs`` field (echo with logprobs computes them too).
    num_prompt_logprobs: int | None = None


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A chat completion; ``num_top_logprobs`` is ``None`` unless ``logprobs`` is true."""

    prompt: Prompt
    stream: StreamOptions
    num_top_logprobs: int | None
    structured: StructuredRequest | None
    tools: ToolRequest


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
    body: dict[str, Any], engine: EngineClient, served_model_name: str
) -> CompletionRequest:
    fields = Fields(body)
    check_model(fields, served_model_name)
    if fields.raw("suffix"):
        fields.fail("suffix", "is not supported")
    num_logprobs = read_logprobs_count(fields, "logprobs")
    is_echo = fields.read_bool("echo", False)
    stream = _stream_options(fields)
    structured = read_structured_outputs(fields)
    sampling = parse_sampling(
        fields,
        engine,
        max_tokens_names=("max_tokens",),
        default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        logprobs=num_logprobs,
    )
    num_prompt_logprobs = sampling.params.prompt_logprobs
    if is_echo and num_logprobs is not None:
        # The echoed prompt's logprobs are prompt logprobs, with as many alternatives.
        asked = sampling.params.prompt_logprobs
        sampling = attrs.evolve(
            sampling,
            params=attrs.evolve(sampling.params, prompt_logprobs=max(asked or 0, num_logprobs)),
        )
    prompts = tuple(
        Prompt(
            text=text,
            token_ids=token_ids,
            params=_constrained(
                sampling.fit(len(token_ids), engine, prompt_param="prompt"), structured
            ),
        )
        for text, token_ids in _read_prompts(fields, engine, sampling.params.n)
    )
    accept_inert_fields(fields)
    fields.refuse_unread()
    return CompletionRequest(
        prompts=prompts,
        n=sampling.params.n,
        stream=stream,
        is_echo=is_echo,
        num_logprobs=num_logprobs,
        structured=structured,
        num_prompt_logprobs=num_prompt_logprobs,
    )


def parse_chat_request(
    body: dict[str, Any],
    engine: EngineClient,
    served_model_name: str,
    *,
    tool_call_parser: str | None = None,
    image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
) -> ChatRequest:
    """``tool_call_parser`` is the server's ``--tool-call-parser`` (``None``: no auto tools);
    ``image_limits`` bound the images of the messages."""
    fields = Fields(body)
    check_model(fields, served_model_name)
    tools = read_tool_request(fields, has_parser=tool_call_parser is not None)
    structured = _one_constraint(fields, read_structured_outputs(fields), tools)
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
    if stream.is_streamed and sampling.params.prompt_logprobs is not None:
        fields.fail("prompt_logprobs", "is only returned by a chat completion that is not streamed")
    chat = read_chat_prompt(engine, fields, tools=tools.template_tools, limits=image_limits)
    accept_inert_fields(fields)
    fields.refuse_unread()
    token_ids = chat.token_ids
    if not token_ids:
        fields.fail("messages", "the rendered conversation is empty")
    params = _constrained(sampling.fit(len(token_ids), engine, prompt_param="messages"), structured)
    is_reading_markers = tools.choice == "auto" and tool_call_parser in SPECIAL_TOKEN_FORMATS
    if is_reading_markers and not fields.has("skip_special_tokens"):
        params = attrs.evolve(params, skip_special_tokens=False)
    prompt = Prompt(text=chat.text, token_ids=token_ids, params=params, images=chat.images)
    return ChatRequest(
        prompt=prompt,
        stream=stream,
        num_top_logprobs=num_top_logprobs,
        structured=structured,
        tools=tools,
    )


def _one_constraint(
    fields: Fields, structured: StructuredRequest | None, tools: ToolRequest
) -> StructuredRequest | None:
    """The request's grammar: its structured-output fields', or the one its tool choice
    needs; both at once is a 400."""
    tool_grammar = tools.grammar()
    if tool_grammar is None:
        return structured
    if structured is not None:
        fields.fail(
            structured.param.split(".")[0],
            f"cannot be combined with tool_choice {tools.choice!r}, which constrains the output",
        )
    return StructuredRequest(params=tool_grammar, param="tools")


def _constrained(params: SamplingParams, structured: StructuredRequest | None) -> SamplingParams:
    if structured is None:
        return params
    return attrs.evolve(params, structured_outputs=structured.params)


def render_chat_prompt(
    engine: EngineClient,
    fields: Fields,
    *,
    tools: list[dict[str, Any]] | None = None,
    images: list[ImageSource] | None = None,
) -> str:
    """The prompt text of the request's ``messages`` under the model's chat template, with
    ``add_generation_prompt`` and ``chat_template_kwargs`` read from ``fields``. Each image
    part's source is appended to ``images`` (``None``: image parts are refused)."""
    messages = read_messages(fields, images)
    add_generation_prompt = fields.read_bool("add_generation_prompt", True)
    kwargs = fields.read_object("chat_template_kwargs")
    template = engine.chat_template
    for name in sorted(kwargs.body):
        if (error := template.variable_error(name)) is not None:
            kwargs.fail(name, error)
    try:
        return engine.render_chat(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            template_kwargs=dict(kwargs.body),
        )
    except ChatTemplateError as error:
        raise bad_request(str(error), param="messages") from error


@functools.lru_cache(maxsize=4)
def _max_token_bytes(tokenizer: Tokenizer) -> int:
    return tokenizer.max_token_bytes()


def check_prompt_text(
    fields: Fields, param: str, text: str, engine: EngineClient, *, contexts: int = 1
) -> None:
    """A 400 for a text too long to be ``contexts`` × ``max_seq_len`` tokens, before any time
    goes into tokenizing it (each token stands for at most ``max_token_bytes`` of text)."""
    limit = contexts * engine.info.max_seq_len * _max_token_bytes(engine.tokenizer)
    if len(text) > limit or len(text.encode()) > limit:
        what = "a prompt of" if contexts == 1 else f"{contexts} prompts of"
        fields.fail(
            param,
            f"the text is longer than {what} max_seq_len ({engine.info.max_seq_len}) tokens can be "
            f"({limit} bytes)",
        )


def _read_prompts(
    fields: Fields, engine: EngineClient, n: int
) -> list[tuple[str | None, tuple[int, ...]]]:
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
    if len(items) * n > MAX_SEQUENCES_PER_REQUEST:
        fields.fail(
            "n",
            f"{len(items)} prompts x n={n} is {len(items) * n} sequences; at most "
            f"{MAX_SEQUENCES_PER_REQUEST} in one request",
        )
    tokenizer = engine.tokenizer
    vocab_size = engine.info.config.vocab_size
    prompts: list[tuple[str | None, tuple[int, ...]]] = []
    for item in items:
        if isinstance(item, str):
            check_prompt_text(fields, "prompt", item, engine)
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
    include_usage = options.read_bool("include_usage", False)
    options.refuse_unread()
    return StreamOptions(is_streamed=is_streamed, include_usage=include_usage)


@attrs.frozen(kw_only=True)
class ChatPrompt:
    """A rendered conversation: its text, its tokens (each image's tokens expanded) and
    where its images stand."""

    text: str = attrs.field(repr=False)
    token_ids: tuple[int, ...] = attrs.field(repr=False)
    images: tuple[PromptImage, ...] = attrs.field(default=(), repr=False)


def read_chat_prompt(
    engine: EngineClient,
    fields: Fields,
    *,
    tools: list[dict[str, Any]] | None = None,
    limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
    contexts: int = 1,
    add_special_tokens: bool = False,
) -> ChatPrompt:
    """The request's ``messages`` rendered, checked for length (``contexts`` x
    ``max_seq_len``), tokenized, and its images read and prepared (400s name the part)."""
    encoder = engine.image_encoder
    sources: list[ImageSource] | None = [] if encoder is not None else None
    text = render_chat_prompt(engine, fields, tools=tools, images=sources)
    check_prompt_text(fields, "messages", text, engine, contexts=contexts)

    def tokenize(text: str) -> list[int]:
        return engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    if not sources or encoder is None:
        return ChatPrompt(text=text, token_ids=tuple(tokenize(text)))
    max_images = engine.info.images_per_prompt
    prepared = prepare_images(sources, encoder, limits, max_images=max_images)
    try:
        token_ids, placed = images_in_prompt(encoder, tokenize, text, prepared)
    except ValueError as error:
        raise bad_request(
            f"{error}: the chat template must place one image marker per image part",
            param="messages",
        ) from error
    return ChatPrompt(text=text, token_ids=token_ids, images=placed)
