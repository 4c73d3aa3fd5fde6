"""Models, health, metrics, version, tokenize / detokenize, and the 501 stubs."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from metrale_server.api.errors import ApiError, bad_request, closing_if_body
from metrale_server.api.fields import Fields, is_int, parse_json_object
from metrale_server.api.protocol import check_model, check_prompt_text, read_chat_prompt
from metrale_server.api.state import ServerState
from metrale_server.api.tool_fields import read_tool_request

# /tokenize counts texts longer than one context (to chunk them), up to this many contexts.
TOKENIZE_CONTEXTS = 16
NOT_IMPLEMENTED_PREFIXES = ("moderations", "files", "batches", "audio", "images")


def _tokenize(raw: bytes, state: ServerState) -> tuple[Fields, list[int]]:
    """The request's fields and its text's tokens (the chat template's, with ``messages``)."""
    fields = Fields(parse_json_object(raw))
    check_model(fields, state.served_model_name)
    if fields.has("messages"):
        # The tools only shape the prompt here: how calls would be read does not matter.
        tools = read_tool_request(fields, has_parser=True)
        chat = read_chat_prompt(
            state.engine,
            fields,
            tools=tools.template_tools,
            limits=state.image_limits,
            contexts=TOKENIZE_CONTEXTS,
            add_special_tokens=fields.read_bool("add_special_tokens", False),
        )
        return fields, list(chat.token_ids)
    else:
        prompt = fields.read_optional_str("prompt")
        if prompt is None:
            raise bad_request("prompt: is required (or messages)", param="prompt")
        text, param = prompt, "prompt"
        add_special_tokens = fields.read_bool("add_special_tokens", True)
    check_prompt_text(fields, param, text, state.engine, contexts=TOKENIZE_CONTEXTS)
    return fields, state.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "metrale",
        # The checkpoint's file or directory name: its absolute path says who runs the server
        # where, to anyone who can read this route.
        "root": state.engine.info.source.path.name,
        "max_model_len": state.engine.info.max_seq_len,
        # What a request's messages may hold (the web page offers images only where listed).
        "input_modalities": ["text", "image"] if state.engine.info.images_per_prompt else ["text"],
    }


async def list_models(request: Request, *, state: ServerState) -> Response:
    return JSONResponse({"object": "list", "data": [model_card(state)]})


async def get_model(request: Request, *, state: ServerState) -> Response:
    model_id = request.path_params["model_id"]
    if model_id != state.served_model_name:
        raise ApiError(
            404, f"the model {model_id!r} does not exist", param="model", code="model_not_found"
        )
    return JSONResponse(model_card(state))


async def health(request: Request, *, state: ServerState) -> Response:
    """200 once ready; 503 while loading, draining, or after the engine thread died."""
    if state.is_draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not state.is_ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    if not state.engine.is_running:
        return JSONResponse(
            {"status": "faulted", "reason": "the engine thread stopped"}, status_code=503
        )
    return JSONResponse({"status": "ready", "model": state.served_model_name})


async def health_live(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def metrics(request: Request, *, state: ServerState) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def server_version(request: Request) -> Response:
    return JSONResponse({"version": version("metrale-server")})


async def tokenize(request: Request, *, state: ServerState) -> Response:
    """vLLM's shape: ``prompt`` (or chat ``messages``) → ``{count, max_model_len, tokens}``."""
    raw = await request.body()
    fields, tokens = await state.preparer.run(lambda: _tokenize(raw, state))
    token_strs = None
    is_returning_strs = fields.read_bool("return_token_strs", False)
    fields.refuse_unread()
    if is_returning_strs:
        token_strs = [state.engine.tokenizer.id_to_token(token) for token in tokens]
    return JSONResponse(
        {
            "count": len(tokens),
            "max_model_len": state.engine.info.max_seq_len,
            "tokens": tokens,
            "token_strs": token_strs,
        }
    )


async def detokenize(request: Request, *, state: ServerState) -> Response:
    """vLLM's shape: ``{tokens}`` → ``{prompt}``."""
    fields = Fields(parse_json_object(await request.body()))
    check_model(fields, state.served_model_name)
    tokens = fields.read_list("tokens")
    vocab_size = state.engine.info.config.vocab_size
    if tokens is None:
        fields.fail("tokens", "is required")
    if not all(is_int(t) and 0 <= t < vocab_size for t in tokens):
        fields.fail("tokens", f"expected token ids in 0..{vocab_size - 1}")
    fields.refuse_unread()
    return JSONResponse({"prompt": state.engine.tokenizer.decode(tokens)})


async def not_implemented(request: Request) -> Response:
    raise ApiError(
        501,
        f"{request.method} {request.url.path} is not implemented by this server",
        code="not_implemented",
        headers=closing_if_body(request.headers),
    )
