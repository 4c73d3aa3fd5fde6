"""``spec_checkpoint_*``: what speculation keeps per slot to roll state back, by hand."""

from __future__ import annotations

import pytest

from metrale_config import ModelConfig
from metrale_model_arch.memory.spec_rollback import (
    spec_checkpoint_bytes_per_slot,
    spec_checkpoint_reserve_bytes,
)

# Default GLM-5.3: 34 KDA layers of 64 heads x 128: float32 recurrent 64 x 128 x 128 (4_194_304
# bytes) and conv 3 x 64 x 128 channels x 3 inputs (294_912 bytes); 11 DSA layers, each one pool
# of 16 rows of 128 float32 keys (8_192 bytes) and, flat, their 16 flag bytes.
KDA = 34 * (4_194_304 + 294_912)  # 152_633_344
POOLS_PAGED = 11 * 16 * 128 * 4  # 90_112
POOLS_FLAT = POOLS_PAGED + 11 * 16  # 90_288


@pytest.mark.parametrize(("paged", "pools"), [(True, POOLS_PAGED), (False, POOLS_FLAT)])
def test_a_glm5_slot_keeps_its_kda_state_and_one_pool_per_dsa_layer(
    glm5_next: ModelConfig, paged: bool, pools: int
) -> None:
    assert spec_checkpoint_bytes_per_slot(glm5_next, indexer_paged=paged) == KDA + pools
    reserve = spec_checkpoint_reserve_bytes(glm5_next, 8, indexer_paged=paged, spec_on=True)
    assert reserve == 8 * (KDA + pools)
    assert spec_checkpoint_reserve_bytes(glm5_next, 0, indexer_paged=paged, spec_on=True) == (
        KDA + pools
    )


def test_nothing_without_speculation_or_without_state(
    glm5_next: ModelConfig, tiny_llama: ModelConfig
) -> None:
    assert spec_checkpoint_reserve_bytes(glm5_next, 8, indexer_paged=False, spec_on=False) == 0
    assert spec_checkpoint_reserve_bytes(tiny_llama, 8, indexer_paged=False, spec_on=True) == 0
