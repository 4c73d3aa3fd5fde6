"""``SamplingParams``: how one request's tokens are chosen and when it stops."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from metrale_server.pooling.params import PoolingParams
from metrale_server.structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20


def _str_tuple(values: Iterable[str] | str) -> tuple[str, ...]:
    return (values,) if isinstance(values, str) else tuple(values)


def _int_set(values: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in values)


def _check(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{field}: {message}")


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Per-request sampling, vLLM's names and meanings.

    ``temperature == 0`` is greedy. ``top_k`` of 0 or -1 and ``top_p == 1`` disable those
    filters. ``seed`` gives the same text whether the request runs alone or in any batch.
    ``logprobs`` asks for the chosen token's log-probability plus that many alternatives
    (0..20). ``stop`` strings end generation and are not part of the text.
    ``structured_outputs`` constrains every output to a grammar (JSON schema, regex, choice,
    grammar); such an output ends when its grammar is complete and the model picks EOS.
    ``prompt_logprobs`` (vLLM's field) asks for each prompt token's log-probability given
    the tokens before it, plus that many alternatives (0..20), computed in the prefill (the
    request then takes no prefix-cache hit). ``pooling`` makes the request read one vector
    from its prompt (an embedding or a score, :class:`PoolingParams`) and generate nothing.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    seed: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    # A set: each sampled token is looked up in it, on the engine thread and the event loop.
    stop_token_ids: frozenset[int] = attrs.field(default=frozenset(), converter=_int_set)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    prompt_logprobs: int | None = None
    pooling: PoolingParams | None = None

    def __attrs_post_init__(self) -> None:
        _check(self.n >= 1, "n", f"must be at least 1, got {self.n}")
        _check(
            self.max_tokens is None or self.max_tokens >= 1,
            "max_tokens",
            f"must be at least 1, got {self.max_tokens}",
        )
        _check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"must not exceed max_tokens ({self.max_tokens}), got {self.min_tokens}",
        )
        _check(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= -1, "top_k", f"must be -1, 0 (off) or positive, got {self.top_k}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty}",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}",
        )
        _check(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty}",
        )
        _check(
            self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
            "logprobs",
            f"must be in 0..{MAX_LOGPROBS}, got {self.logprobs}",
        )
        _check(
            self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
            "prompt_logprobs",
            f"must be in 0..{MAX_LOGPROBS}, got {self.prompt_logprobs}",
        )
        _check(all(s for s in self.stop), "stop", "stop strings must be non-empty")
        if self.logit_bias is not None:
            for token_id, bias in self.logit_bias.items():
                _check(
                    -100.0 <= bias <= 100.0,
                    "logit_bias",
                    f"bias for token {token_id} must be in [-100, 100], got {bias}",
                )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
