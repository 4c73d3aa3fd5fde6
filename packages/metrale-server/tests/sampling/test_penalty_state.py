"""Penalty state: built once from a sequence's tokens, then updated one token at a time."""

from __future__ import annotations

import torch

from metrale_server.sampling.penalty_state import PenaltyState


def test_incremental_updates_equal_a_rebuild_from_the_whole_history() -> None:
    prompt, outputs = [3, 1, 3], [4, 4, 0, 2, 4]
    state = PenaltyState(prompt, outputs[:1], 6, torch.device("cpu"))
    for token in outputs[1:]:
        state.add_output_token(token)
    rebuilt = PenaltyState(prompt, outputs, 6, torch.device("cpu"))
    assert torch.equal(state.seen, rebuilt.seen)
    assert torch.equal(state.output_counts, rebuilt.output_counts)
    assert state.seen.tolist() == [True, True, True, True, True, False]
    assert state.output_counts.tolist() == [1.0, 0.0, 1.0, 0.0, 3.0, 0.0]


def test_ids_outside_the_vocabulary_are_ignored() -> None:
    state = PenaltyState([1, 99], [], 4, torch.device("cpu"))
    state.add_output_token(-1)
    state.add_output_token(4)
    assert state.seen.tolist() == [False, True, False, False]
    assert state.output_counts.sum().item() == 0.0
