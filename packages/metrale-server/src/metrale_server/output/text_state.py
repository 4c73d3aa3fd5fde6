"""One output's text as it grows: detokenized, cut at stop strings, reported without repeats.

Every operation costs O(what is new): the text reported so far is kept as pieces (joined once,
for a cumulative report), and stop strings are searched in the new text plus the few
characters before it that a stop string could straddle.
"""

from __future__ import annotations

from metrale_server.output.detokenizer import Decoder, IncrementalDetokenizer
from metrale_server.output.outputs import CompletionOutput, TokenLogprob
from metrale_server.output.stop_strings import StopStringMatcher
from metrale_server.sampling.params import SamplingParams


class TextState:
    """The text, token ids, logprobs and finish state of one output, and what was reported."""

    def __init__(self, decoder: Decoder, params: SamplingParams) -> None:
        self._detokenizer = IncrementalDetokenizer(
            decoder, skip_special_tokens=params.skip_special_tokens
        )
        self._matcher = StopStringMatcher(params.stop)
        self._lookback = max((len(stop) for stop in params.stop), default=1) - 1
        self._include_stop = params.include_stop_str_in_output
        self._reported: list[str] = []
        # The reported text's last characters a stop string could start in.
        self._recent = ""
        # Text made but not reported yet (held back while it may start a stop string).
        self._pending = ""
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._num_reported_tokens = 0
        self._num_reported_logprobs = 0

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def add_token(self, token_id: int, *, render: bool, check_stop_strings: bool) -> bool:
        """Append one generated token; ``render=False`` for EOS / stop tokens (ids only).
        Whether a stop string finished the output."""
        self.token_ids.append(token_id)
        if not render:
            return False
        piece = self._detokenizer.push(token_id)
        self._pending += piece
        return check_stop_strings and bool(piece) and self._apply_stop_strings(len(piece))

    def add_logprob(self, entry: TokenLogprob) -> None:
        self.cumulative_logprob += entry.logprob
        if self.logprobs is not None:
            self.logprobs.append(entry)

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.stop_reason = stop_reason
            if reason != "stop" or not isinstance(stop_reason, str):
                self._pending += self._detokenizer.flush()

    def _apply_stop_strings(self, num_new_chars: int) -> bool:
        window = self._recent + self._pending
        found = self._matcher.find(window, num_new_chars)
        if found is None:
            return False
        index, stop = found
        end = index + len(stop) if self._include_stop else index
        self._pending = window[len(self._recent) : max(end, len(self._recent))]
        self.finish("stop", stop)
        return True

    def report(self, index: int, *, cumulative: bool) -> CompletionOutput:
        """What is new since the last report as the delta; the cumulative text, ids and
        logprobs too when ``cumulative`` (O(length): for the last report, or when asked)."""
        held = 0 if self.finish_reason else self._matcher.num_held_chars(self._pending)
        delta_text = self._pending[: len(self._pending) - held]
        self._pending = self._pending[len(delta_text) :]
        if delta_text:
            self._reported.append(delta_text)
            if self._lookback:
                self._recent = (self._recent + delta_text)[-self._lookback :]
        delta_ids = tuple(self.token_ids[self._num_reported_tokens :])
        self._num_reported_tokens = len(self.token_ids)
        delta_logprobs: tuple[TokenLogprob, ...] | None = None
        if self.logprobs is not None:
            delta_logprobs = tuple(self.logprobs[self._num_reported_logprobs :])
            self._num_reported_logprobs = len(self.logprobs)
        if cumulative:
            text = "".join(self._reported)
            self._reported = [text]
        return CompletionOutput(
            index=index,
            text=text if cumulative else "",
            token_ids=tuple(self.token_ids) if cumulative else (),
            num_tokens=len(self.token_ids),
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            logprobs=(
                None if self.logprobs is None else (tuple(self.logprobs) if cumulative else ())
            ),
            delta_logprobs=delta_logprobs,
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            is_cumulative=cumulative,
        )
