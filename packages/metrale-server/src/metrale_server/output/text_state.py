"""One output's text as it grows: detokenized, cut at stop strings, streamed without repeats."""

from __future__ import annotations

from metrale_server.output.detokenizer import Decoder, IncrementalDetokenizer
from metrale_server.output.outputs import CompletionOutput, TokenLogprob
from metrale_server.output.stop_strings import StopStringMatcher
from metrale_server.sampling.params import SamplingParams


class TextState:
    """The text, logprobs and finish state of one sequence, and what was already reported."""

    def __init__(self, decoder: Decoder, params: SamplingParams) -> None:
        self._detokenizer = IncrementalDetokenizer(
            decoder, skip_special_tokens=params.skip_special_tokens
        )
        self._matcher = StopStringMatcher(params.stop)
        self._include_stop = params.include_stop_str_in_output
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._num_reported_chars = 0
        self._num_reported_tokens = 0

    def add_token(self, token_id: int, *, render: bool, check_stop_strings: bool) -> None:
        """Append one generated token; ``render=False`` for EOS / stop tokens (ids only)."""
        self.token_ids.append(token_id)
        if not render:
            return
        piece = self._detokenizer.push(token_id)
        self.text += piece
        if check_stop_strings:
            self._apply_stop_strings(len(piece))

    def add_logprob(self, entry: TokenLogprob) -> None:
        self.cumulative_logprob += entry.logprob
        if self.logprobs is not None:
            self.logprobs.append(entry)

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.stop_reason = stop_reason
            if reason != "stop" or not isinstance(stop_reason, str):
                self.text += self._detokenizer.flush()

    def _apply_stop_strings(self, num_new_chars: int) -> None:
        found = self._matcher.find(self.text, num_new_chars)
        if found is None:
            return
        index, stop = found
        self.text = self.text[: index + len(stop) if self._include_stop else index]
        self.finish("stop", stop)

    def report(self, index: int) -> CompletionOutput:
        """The cumulative output, with what is new since the last report as the delta."""
        held = 0 if self.finish_reason else self._matcher.num_held_chars(self.text)
        visible = len(self.text) - held
        delta_text = self.text[self._num_reported_chars : visible]
        self._num_reported_chars = max(self._num_reported_chars, visible)
        delta_ids = tuple(self.token_ids[self._num_reported_tokens :])
        self._num_reported_tokens = len(self.token_ids)
        return CompletionOutput(
            index=index,
            text=self.text[:visible],
            token_ids=tuple(self.token_ids),
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
