"""``per_sequence_state_bytes`` at transformers' default GLM-5.3 config, by hand (seed 003)."""

from __future__ import annotations

import pytest

from metrale_config import ModelConfig
from metrale_model_arch.memory import (
    Glm5NextTextSkeleton,
    Mixer,
    PerSequenceState,
    dsa_capacity,
    indexer_state_bytes,
    per_sequence_state_bytes,
)

# Default GLM-5.3: 45 layers, every 4th (3, 7, ..., 43) DSA -> 11 DSA layers; index_head_dim
# 128 (4 * 128 + 1 = 513 bytes a token), index_kpool 16, hidden 4096, vocab 154880.
PER_LAYER_16K = 16384 * 513  # 8_404_992
PER_LAYER_128K = 131072 * 513  # 67_239_936
# concat 2*4096*2 + x 4096*2 + logits 154880*2 + arg 4 + head_xchg 16
PROPOSER_FIXED = 16384 + 8192 + 309760 + 4 + 16  # 334_356


def test_the_default_skeleton_has_11_dsa_and_34_linear_layers(glm5_next: ModelConfig) -> None:
    skeleton = Glm5NextTextSkeleton.from_config(glm5_next)
    assert skeleton.num_layers_with(Mixer.DSA) == 11
    assert skeleton.num_layers_with(Mixer.LINEAR) == 34
    assert [layer.index for layer in skeleton.layers if layer.mixer is Mixer.DSA] == list(
        range(3, 45, 4)
    )


def test_capacity_rounds_down_to_whole_pools() -> None:
    assert dsa_capacity(16384, 16) == 16384
    assert dsa_capacity(16390, 16) == 16384
    assert dsa_capacity(15, 16) == 0
    assert dsa_capacity(7, 0) == 7  # a pool of 0 counts as 1
    assert indexer_state_bytes(16, 128) == 16 * 513


@pytest.mark.parametrize(
    ("max_seq_len", "per_layer"), [(16384, PER_LAYER_16K), (131072, PER_LAYER_128K)]
)
def test_flat_indexer_charges_every_dsa_layer(
    glm5_next: ModelConfig, max_seq_len: int, per_layer: int
) -> None:
    state = per_sequence_state_bytes(glm5_next, max_seq_len, False, indexer_paged=False)
    assert state == PerSequenceState(target_layers=11 * per_layer, proposer=0)
    expected = {16384: 92_454_912, 131072: 739_639_296}[max_seq_len]
    assert state.total() == expected


@pytest.mark.parametrize("max_seq_len", [16384, 131072])
def test_paged_indexer_charges_nothing_per_sequence(
    glm5_next: ModelConfig, max_seq_len: int
) -> None:
    assert per_sequence_state_bytes(glm5_next, max_seq_len, False, indexer_paged=True) == (
        PerSequenceState()
    )


def test_speculation_without_a_sparse_drafter_adds_nothing(glm5_next: ModelConfig) -> None:
    off = per_sequence_state_bytes(glm5_next, 16384, False)
    on = per_sequence_state_bytes(glm5_next, 16384, True)
    assert on == off


@pytest.mark.parametrize(
    ("max_seq_len", "per_layer", "proposer"),
    [(16384, PER_LAYER_16K, 8_739_348), (131072, PER_LAYER_128K, 67_574_292)],
)
@pytest.mark.parametrize("indexer_paged", [False, True])
def test_proposer_term_only_with_speculation_on(
    glm5_next_with_mtp: ModelConfig,
    max_seq_len: int,
    per_layer: int,
    proposer: int,
    indexer_paged: bool,
) -> None:
    assert proposer == per_layer + PROPOSER_FIXED
    on = per_sequence_state_bytes(
        glm5_next_with_mtp, max_seq_len, True, indexer_paged=indexer_paged
    )
    off = per_sequence_state_bytes(
        glm5_next_with_mtp, max_seq_len, False, indexer_paged=indexer_paged
    )
    target = 0 if indexer_paged else 11 * per_layer
    assert on == PerSequenceState(target_layers=target, proposer=proposer)
    assert off == PerSequenceState(target_layers=target, proposer=0)


def test_for_batch_multiplies_once_and_zero_counts_as_one() -> None:
    state = PerSequenceState(target_layers=1000, proposer=24)
    assert state.total() == 1024
    assert state.for_batch(0) == state.total()
    assert state.for_batch(1) == 1024
    assert state.for_batch(8) == 8192


def test_a_model_without_dsa_layers_is_charged_nothing(tiny_llama: ModelConfig) -> None:
    for spec_on in (False, True):
        state = per_sequence_state_bytes(tiny_llama, 131072, spec_on, indexer_paged=False)
        assert state == PerSequenceState()
        assert state.for_batch(128) == 0
