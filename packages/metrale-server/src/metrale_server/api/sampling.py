"""Sampling fields of a request body → ``SamplingParams``, checked against the engine's limits."""

from __future__ import annotations

import attrs

from metrale_server.api.errors import bad_request
from metrale_server.api.fields import Fields, describe, is_int
from metrale_server.engine.client import EngineClient
from metrale_server.sampling.output_room import OutputRoomError, fit_max_tokens
from metrale_server.sampling.params import MAX_LOGPROBS, SamplingParams

MAX_N = 128
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 1000
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's limit
MAX_LOGIT_BIAS = 100.0
MAX_SEED = 2**63 - 1


@attrs.frozen(kw_only=True)
class SamplingRequest:
    """A request's sampling, before its prompt length is known.

    ``params.max_tokens`` is what the client asked for (``None``: not given); ``fit`` settles it.
    ``max_tokens_param`` is the field the client used, for error messages.
    """

    params: SamplingParams
    max_tokens_param: str
    default_max_tokens: int | None

    def fit(
        self, num_prompt_tokens: int, engine: EngineClient, *, prompt_param: str
    ) -> SamplingParams:
        """The params for one prompt: ``max_tokens`` filled in and checked against max_seq_len
        (:func:`~metrale_server.sampling.output_room.fit_max_tokens`, as the engine checks)."""
        try:
            max_tokens = fit_max_tokens(
                num_prompt_tokens,
                self.params.max_tokens,
                engine.info.max_seq_len,
                default=self.default_max_tokens,
            )
        except OutputRoomError as error:
            raise bad_request(
                error.describe(max_tokens_param=self.max_tokens_param),
                param=prompt_param if error.max_tokens is None else self.max_tokens_param,
            ) from error
        if self.params.min_tokens > max_tokens:
            raise bad_request(
                f"min_tokens ({self.params.min_tokens}) exceeds max_tokens ({max_tokens})",
                param="min_tokens",
            )
        return attrs.evolve(self.params, max_tokens=max_tokens)


def parse_sampling(
    fields: Fields,
    engine: EngineClient,
    *,
    max_tokens_names: tuple[str, ...],
    default_max_tokens: int | None,
    logprobs: int | None,
) -> SamplingRequest:
    """The sampling fields shared by completions and chat (vLLM's extensions included).

    ``max_tokens_names`` are the accepted spellings, preferred first; ``logprobs`` is already
    read (its field differs per endpoint).
    """
    vocab_size = engine.info.config.vocab_size
    # Every spelling is looked at (so none is refused as unread); the preferred one wins.
    given = [name for name in max_tokens_names if fields.has(name)]
    max_tokens_param = given[0] if given else max_tokens_names[0]
    max_tokens = fields.read_optional_int(
        max_tokens_param, minimum=1, maximum=engine.info.max_seq_len
    )
    max_n = min(MAX_N, engine.info.max_batch_size)
    best_of = fields.read_optional_int("best_of", minimum=1)
    n = fields.read_int("n", 1, minimum=1, maximum=max_n)
    if best_of is not None and best_of != n:
        fields.fail("best_of", "is not supported (only best_of == n)")
    try:
        params = SamplingParams(
            n=n,
            max_tokens=max_tokens,
            min_tokens=fields.read_int("min_tokens", 0, minimum=0),
            temperature=fields.read_float("temperature", 1.0, minimum=0.0, maximum=2.0),
            top_p=fields.read_float("top_p", 1.0, minimum=0.0, maximum=1.0, exclusive_minimum=True),
            top_k=fields.read_int("top_k", 0, minimum=-1),
            min_p=fields.read_float("min_p", 0.0, minimum=0.0, maximum=1.0),
            presence_penalty=fields.read_float("presence_penalty", 0.0, minimum=-2.0, maximum=2.0),
            frequency_penalty=fields.read_float(
                "frequency_penalty", 0.0, minimum=-2.0, maximum=2.0
            ),
            repetition_penalty=fields.read_float(
                "repetition_penalty", 1.0, minimum=0.0, maximum=2.0, exclusive_minimum=True
            ),
            logit_bias=_logit_bias(fields, vocab_size),
            seed=fields.read_optional_int("seed", minimum=-MAX_SEED - 1, maximum=MAX_SEED),
            stop=_stop_strings(fields),
            stop_token_ids=_token_ids(fields, "stop_token_ids", vocab_size),
            ignore_eos=fields.read_bool("ignore_eos", False),
            logprobs=logprobs,
            prompt_logprobs=read_logprobs_count(fields, "prompt_logprobs"),
            skip_special_tokens=fields.read_bool("skip_special_tokens", True),
            include_stop_str_in_output=fields.read_bool("include_stop_str_in_output", False),
        )
    except ValueError as error:
        field, _, _ = str(error).partition(":")
        raise bad_request(str(error), param=field if field.isidentifier() else None) from error
    return SamplingRequest(
        params=params, max_tokens_param=max_tokens_param, default_max_tokens=default_max_tokens
    )


def read_logprobs_count(fields: Fields, name: str) -> int | None:
    return fields.read_optional_int(name, minimum=0, maximum=MAX_LOGPROBS)


def _stop_strings(fields: Fields) -> tuple[str, ...]:
    value = fields.raw("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        fields.fail("stop", f"expected a string or an array of strings, got {describe(value)}")
    if len(stops) > MAX_STOP_STRINGS:
        fields.fail("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    if not all(stops):
        fields.fail("stop", "stop strings must not be empty")
    if any(len(stop) > MAX_STOP_STRING_CHARS for stop in stops):
        fields.fail("stop", f"a stop string is at most {MAX_STOP_STRING_CHARS} characters")
    return tuple(stops)


def _token_ids(fields: Fields, name: str, vocab_size: int) -> tuple[int, ...]:
    values = fields.read_list(name) or []
    if len(values) > MAX_STOP_TOKEN_IDS:
        fields.fail(name, f"at most {MAX_STOP_TOKEN_IDS} token ids, got {len(values)}")
    if not all(is_int(v) and 0 <= v < vocab_size for v in values):
        fields.fail(name, f"expected token ids in 0..{vocab_size - 1}")
    return tuple(values)


def _logit_bias(fields: Fields, vocab_size: int) -> dict[int, float] | None:
    value = fields.raw("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        fields.fail("logit_bias", f"expected an object, got {describe(value)}")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        fields.fail("logit_bias", f"at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(value)}")
    biases: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token_id = int(key)
        except ValueError:
            fields.fail("logit_bias", f"key {key!r} is not a token id")
        if not 0 <= token_id < vocab_size:
            fields.fail("logit_bias", f"token id {token_id} is outside 0..{vocab_size - 1}")
        if not isinstance(bias, int | float) or isinstance(bias, bool):
            fields.fail("logit_bias", f"the bias for {key!r} must be a number")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            fields.fail("logit_bias", f"the bias for {key!r} must be in [-100, 100], got {bias}")
        biases[token_id] = float(bias)
    return biases
