"""The MTP proposer's state allocated (``allocate_proposer_state``) against seed 003's formula
(``per_sequence_state_bytes(...).proposer``) at transformers' default GLM-5.3, byte for byte."""

from __future__ import annotations

from metrale_testing.recording_allocator import RecordingAllocator

from metrale_config import ModelConfig
from metrale_model_arch.memory import per_sequence_state_bytes
from metrale_model_arch.owners import PROPOSER_STATE
from metrale_model_arch.proposer_state import allocate_proposer_state

from .conftest import glm5_next_config

MAX_SEQ_LEN = 1030  # 64 whole pools of 16: the indexer holds 1024 positions


def test_the_allocation_is_the_seed_formula_times_the_slots(
    glm5_next_with_mtp: ModelConfig,
) -> None:
    allocator = RecordingAllocator()
    state = allocate_proposer_state(
        glm5_next_with_mtp, num_slots=3, max_seq_len=MAX_SEQ_LEN, device="cpu",
        allocator=allocator,
    )  # fmt: skip
    assert state is not None
    # indexer 1024 x (128 float32 + 1 flag); concat 2 x 4096, x 4096, logits 154880 (bf16);
    # arg 4 B; head_xchg 16 B.
    per_seq = 1024 * 513 + 2 * 4096 * 2 + 4096 * 2 + 154880 * 2 + 4 + 16
    planned = per_sequence_state_bytes(glm5_next_with_mtp, MAX_SEQ_LEN, True).proposer
    assert planned == per_seq == 859_668
    assert allocator.bytes_by_owner == {PROPOSER_STATE: 3 * per_seq}
    keys, flags = state.indexer
    assert keys.shape == (3, 1024, 128)
    assert flags.shape == (3, 1024)
    keys[1].fill_(1.0)
    flags[1].fill_(1)
    state.reset(1)
    assert not keys.any()
    assert not flags.any()


def test_an_unnamed_mtp_layer_of_glm5_drafts_with_dsa() -> None:
    unnamed = glm5_next_config(num_nextn_predict_layers=1)
    named = glm5_next_config(num_nextn_predict_layers=1, mtp_layer_types=["indexed_attention"])
    assert per_sequence_state_bytes(unnamed, MAX_SEQ_LEN, True) == per_sequence_state_bytes(
        named, MAX_SEQ_LEN, True
    )


def test_no_state_without_a_dsa_drafter(glm5_next: ModelConfig) -> None:
    allocator = RecordingAllocator()
    state = allocate_proposer_state(
        glm5_next, num_slots=3, max_seq_len=MAX_SEQ_LEN, device="cpu", allocator=allocator
    )
    assert state is None
    assert not allocator.bytes_by_owner
