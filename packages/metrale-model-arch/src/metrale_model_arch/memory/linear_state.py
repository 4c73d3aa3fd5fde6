"""The linear-attention (KDA) state pool: recurrent and conv state per slot.

Each linear-attention layer keeps, per sequence slot, a float32 (float64 at a float64 serve)
recurrent state and the last
``conv_kernel_dim - 1`` inputs of its short convolution (see
:class:`~metrale_model_arch.cache_spec.LinearAttentionSpec`). The pool holds one more slot than
``max_batch_size``: a dummy slot that padded rows write to.
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.cache_spec import FLOAT32_BYTES
from metrale_model_arch.memory.state_pools import state_bytes_per_slot, state_pool_bytes
from metrale_model_arch.owners import LINEAR_STATE_POOL
from metrale_model_arch.registry import cache_specs

# ``dtype_bytes`` below is the serve dtype's: the state is float32 for any narrower one.


def linear_state_bytes_per_slot(config: ModelConfig, dtype_bytes: int = FLOAT32_BYTES) -> int:
    """One sequence's linear-attention state over every linear-attention layer (it does not
    grow with the context)."""
    specs = cache_specs(config, indexer_paged=True)
    return state_bytes_per_slot(
        specs, LINEAR_STATE_POOL, config.max_position_embeddings, dtype_bytes
    )


def linear_state_pool_bytes(
    config: ModelConfig, max_batch_size: int, dtype_bytes: int = FLOAT32_BYTES
) -> int:
    """The pool for ``max_batch_size`` slots (0 counts as 1) plus the dummy slot."""
    specs = cache_specs(config, indexer_paged=True)
    return state_pool_bytes(
        specs,
        LINEAR_STATE_POOL,
        max(max_batch_size, 1),
        config.max_position_embeddings,
        dtype_bytes,
    )
