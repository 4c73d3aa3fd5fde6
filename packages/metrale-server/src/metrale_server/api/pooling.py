"""What the pooling routes (embeddings, score, rerank) share: their inputs checked and turned
into engine requests, one per input, and the vectors those requests read."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request

from metrale_server.api.errors import ApiError, internal_error
from metrale_server.api.fields import Fields
from metrale_server.api.generation import final_outputs, start_generations
from metrale_server.api.protocol import MAX_SEQUENCES_PER_REQUEST, Prompt, check_prompt_text
from metrale_server.api.responses import raise_if_failed
from metrale_server.api.state import ServerState
from metrale_server.engine.client import EngineClient
from metrale_server.pooling.params import PoolingParams
from metrale_server.sampling.params import SamplingParams

MAX_POOLING_INPUTS = MAX_SEQUENCES_PER_REQUEST


def pooling_prompt(text: str | None, token_ids: tuple[int, ...], pooling: PoolingParams) -> Prompt:
    """One engine request that reads ``pooling``'s vector from ``token_ids``."""
    params = SamplingParams(max_tokens=1, temperature=0.0, pooling=pooling)
    return Prompt(text=text, token_ids=token_ids, params=params)


def encode_input(
    fields: Fields, param: str, text: str, engine: EngineClient, *, add_special_tokens: bool
) -> tuple[int, ...]:
    """``text``'s token ids, checked by :func:`check_input_tokens`; ``param`` names it."""
    check_prompt_text(fields, param, text, engine)
    token_ids = engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return check_input_tokens(fields, param, tuple(token_ids), engine)


def check_input_tokens(
    fields: Fields, param: str, token_ids: tuple[int, ...], engine: EngineClient
) -> tuple[int, ...]:
    """A 400 naming ``param`` for an empty input or one too long for the model."""
    if not token_ids:
        fields.fail(param, "must not be empty")
    if len(token_ids) > engine.info.max_seq_len:
        fields.fail(
            param,
            f"has {len(token_ids)} tokens; the model's max_seq_len is {engine.info.max_seq_len}",
        )
    return token_ids


def check_num_inputs(fields: Fields, param: str, num_inputs: int) -> None:
    if num_inputs == 0:
        fields.fail(param, "must not be empty")
    if num_inputs > MAX_POOLING_INPUTS:
        fields.fail(param, f"at most {MAX_POOLING_INPUTS} inputs in one request, got {num_inputs}")


async def pooled_vectors(
    state: ServerState, request: Request, response_id: str, prompts: Sequence[Prompt]
) -> list[tuple[float, ...]]:
    """Each prompt's vector, in order; the engine batches the requests as it can."""
    generations = start_generations(state, response_id, prompts)
    finals = await final_outputs(generations, request.receive)
    vectors = []
    for generation, final in zip(generations, finals, strict=True):
        raise_if_failed(final)
        if generation.is_timed_out:
            raise ApiError(
                504,
                f"the request took over {state.request_timeout_s:g} s (--request-timeout)",
                code="request_timeout",
            )
        if final.pooled is None:
            raise internal_error(
                f"the engine finished pooling request {final.request_id} without its vector",
                log_traceback=False,
            )
        vectors.append(final.pooled)
    return vectors


def pooling_usage(prompts: Sequence[Prompt]) -> dict[str, int]:
    num_tokens = sum(len(prompt.token_ids) for prompt in prompts)
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
