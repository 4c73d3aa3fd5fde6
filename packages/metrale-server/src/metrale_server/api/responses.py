"""Pieces every generation response shares: ids, usage, engine failures, stream progress."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import attrs

from metrale_server.api.errors import ApiError, internal_error
from metrale_server.api.protocol import Prompt
from metrale_server.output.outputs import CompletionOutput, RequestOutput, TokenLogprob


@attrs.frozen(kw_only=True)
class ResponseHeader:
    """The fields every response object and chunk of one request repeats."""

    id: str
    object: str
    created: int
    model: str

    @classmethod
    def new(cls, *, id_prefix: str, object: str, model: str) -> ResponseHeader:
        return cls(
            id=f"{id_prefix}-{uuid.uuid4().hex}",
            object=object,
            created=int(time.time()),
            model=model,
        )

    def body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def raise_if_failed(output: RequestOutput) -> None:
    """An output the engine failed (``error`` set) is a 500, the failure logged, not sent; a
    400 saying why when the request's own input caused it."""
    if output.error is not None and output.is_request_fault:
        raise ApiError(400, output.error, code="request_failed")
    if output.error is not None:
        raise internal_error(
            f"the engine failed request {output.request_id}: {output.error}", log_traceback=False
        )


def usage_body(prompts: Sequence[Prompt], finals: Sequence[RequestOutput]) -> dict[str, Any]:
    """Prompt tokens count each prompt once; completion tokens sum over every output."""
    num_prompt_tokens = sum(len(prompt.token_ids) for prompt in prompts)
    num_completion_tokens = sum(len(o.token_ids) for final in finals for o in final.outputs)
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": sum(final.num_cached_tokens for final in finals)
        },
    }


@attrs.define
class ChoiceProgress:
    """What one streamed choice has sent so far."""

    num_logprobs_sent: int = 0
    text_offset: int = 0
    is_finished: bool = False

    def new_logprobs(self, output: CompletionOutput) -> tuple[TokenLogprob, ...]:
        entries = output.delta_logprobs or ()
        self.num_logprobs_sent += len(entries)
        return entries

    def has_news(self, output: CompletionOutput, entries: Sequence[TokenLogprob]) -> bool:
        """Whether ``output`` brings text, logprobs or its finish; marks the finish as sent."""
        is_new_finish = output.finished and not self.is_finished
        self.is_finished = output.finished
        return bool(output.delta_text or entries or is_new_finish)
