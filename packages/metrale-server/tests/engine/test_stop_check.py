"""check_stop: a stop token, then EOS, then max_tokens, then the context."""

from __future__ import annotations

from metrale_server.engine.sequence import Sequence
from metrale_server.engine.stop_check import StopReason, check_stop
from metrale_server.sampling.params import SamplingParams

EOS = 2


def seq_with(output: list[int], **params: object) -> Sequence:
    seq = Sequence(
        seq_id=0,
        request_id="r",
        prompt_token_ids=(7, 8, 9),
        params=SamplingParams(**params),  # type: ignore[arg-type]
        arrival_time=0.0,
    )
    for token_id in output:
        seq.append_token(token_id)
    return seq


def check(seq: Sequence, max_seq_len: int = 100) -> StopReason | None:
    return check_stop(seq, seq.token_ids[-1], eos_token_ids={EOS}, max_seq_len=max_seq_len)


def test_a_stop_token_wins_and_is_reported() -> None:
    seq = seq_with([5, 6], stop_token_ids=[6], max_tokens=2)
    assert check(seq) == StopReason("stop", 6)


def test_eos_stops_unless_ignored() -> None:
    assert check(seq_with([5, EOS], max_tokens=2)) == StopReason("stop")
    assert check(seq_with([5, EOS], max_tokens=3, ignore_eos=True)) is None
    assert check(seq_with([5, EOS], max_tokens=2, ignore_eos=True)) == StopReason("length")


def test_length_from_max_tokens_or_the_context() -> None:
    assert check(seq_with([5], max_tokens=2)) is None
    assert check(seq_with([5, 6], max_tokens=2)) == StopReason("length")
    assert check(seq_with([5], max_tokens=10), max_seq_len=4) == StopReason("length")
    assert check(seq_with([5], max_tokens=10), max_seq_len=5) is None
