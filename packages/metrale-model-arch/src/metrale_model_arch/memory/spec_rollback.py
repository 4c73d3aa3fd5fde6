"""What speculation keeps to roll a sequence's state back: a checkpoint per slot.

A verify step runs drafts through every layer, and layers whose state is not one row per
position cannot simply be overwritten later: a linear-attention layer's recurrent and conv
state (one per sequence), and the DSA indexer's pool still filling (its running softmax sits in
the pool's rows; see :mod:`~metrale_model_arch.families.glm5_next.indexer_cache`). Before a
verify step each speculating sequence's checkpoint holds that state: every linear-attention
layer's recurrent and conv state, and every DSA layer's rows of the pool holding the step's
first position (``index_kpool`` float32 keys, plus their flag bytes for the flat indexer). The
state and keys are float64 at a float64 serve: ``dtype_bytes`` below is the serve dtype's.
Everything else the step writes is one row per position (K/V, MLA latent, complete pools),
rewritten when the kept tokens run again. Owner ``spec_state_snapshot``, one checkpoint per
slot (no dummy slot), only while speculation is on.
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.cache_spec import FLOAT32_BYTES, SparseAttentionSpec, dtype_bytes_of
from metrale_model_arch.memory.state_pools import state_bytes_per_slot
from metrale_model_arch.owners import LINEAR_STATE_POOL
from metrale_model_arch.registry import cache_specs

FLAG_BYTES = 1


def indexer_checkpoint_bytes(
    index_head_dim: int, index_kpool: int, *, is_flat: bool, dtype_bytes: int = FLOAT32_BYTES
) -> int:
    """One DSA layer's checkpoint: the rows of one pool (their flags too, for a flat indexer)."""
    key_bytes = dtype_bytes_of("compute", dtype_bytes)
    return index_kpool * (index_head_dim * key_bytes + (FLAG_BYTES if is_flat else 0))


def spec_checkpoint_bytes_per_slot(
    config: ModelConfig, *, indexer_paged: bool, dtype_bytes: int = FLOAT32_BYTES
) -> int:
    """One sequence's checkpoint: its linear-attention state and one indexer pool per DSA layer
    (0 for a model whose state is all one row per position)."""
    specs = cache_specs(config, indexer_paged=indexer_paged)
    linear = state_bytes_per_slot(
        specs, LINEAR_STATE_POOL, config.max_position_embeddings, dtype_bytes
    )
    num_indexers = sum(isinstance(spec, SparseAttentionSpec) for spec in specs)
    if num_indexers == 0:
        return linear
    assert config.dsa is not None
    per_indexer = indexer_checkpoint_bytes(
        config.dsa.index_head_dim,
        config.dsa.index_kpool,
        is_flat=not indexer_paged,
        dtype_bytes=dtype_bytes,
    )
    return linear + num_indexers * per_indexer


def spec_checkpoint_reserve_bytes(
    config: ModelConfig,
    max_batch_size: int,
    *,
    indexer_paged: bool,
    spec_on: bool,
    dtype_bytes: int = FLOAT32_BYTES,
) -> int:
    """The checkpoints of ``max_batch_size`` slots (0 counts as 1) while ``spec_on`` (owner
    ``spec_state_snapshot``)."""
    if not spec_on:
        return 0
    per_slot = spec_checkpoint_bytes_per_slot(
        config, indexer_paged=indexer_paged, dtype_bytes=dtype_bytes
    )
    return per_slot * max(max_batch_size, 1)
