"""A speculative draft's memory: a draft model's weights (with its RoPE table), and the draft
pool: a draft model's K/V, or the K/V of the target's own MTP layer (whose weights are the
target's, owner ``weights.mtp``).

The draft caches K/V in a paged pool of its own with as many blocks as the target's pool: a
running sequence never needs more draft blocks than target blocks (the draft caches one
position fewer), so each block the plan buys costs the target's block bytes plus the draft's.
The draft's weights are reserved before the pools are sized; the pools are owners
``kv_pool`` and ``draft_kv_pool``, the weights ``draft_model`` (with, for a draft with
linear-attention layers, its own state slots and their checkpoints: :func:`draft_state_bytes`).
"""

from __future__ import annotations

import attrs

from metrale_config import SPARSE_ATTENTION, ModelConfig
from metrale_model_arch.cache_spec import LayerCacheSpec, SparseAttentionSpec
from metrale_model_arch.memory.kv_price import kv_bytes_per_token
from metrale_model_arch.memory.linear_state import linear_state_pool_bytes
from metrale_model_arch.memory.rope_table import rope_table_bytes
from metrale_model_arch.memory.spec_rollback import spec_checkpoint_reserve_bytes
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.weight_format import Quantization


@attrs.frozen(kw_only=True)
class DraftInputs:
    """The draft model the plan reserves for: its config and its weights' format."""

    config: ModelConfig
    quantization: Quantization = Quantization.NONE


def draft_max_seq_len(draft: ModelConfig, max_seq_len: int) -> int:
    """Positions the draft caches: the serve's ``max_seq_len``, or fewer if the draft has fewer."""
    return min(max_seq_len, draft.max_position_embeddings)


def draft_model_bytes(draft: DraftInputs, dtype_bytes: int, max_seq_len: int) -> int:
    """The draft's weights at ``dtype_bytes`` (or int8) plus its RoPE table."""
    weights = weight_bytes(draft.config, dtype_bytes, draft.quantization).total()
    return weights + rope_table_bytes(draft.config, draft_max_seq_len(draft.config, max_seq_len))


def draft_state_bytes(draft: DraftInputs, max_batch_size: int, dtype_bytes: int) -> int:
    """A draft with per-sequence state (linear attention): its state pool and its checkpoints,
    one per slot (its indexer, like its K/V, paged in the draft pool), at a serve dtype of
    ``dtype_bytes``; 0 for any other."""
    pool = linear_state_pool_bytes(draft.config, max_batch_size, dtype_bytes)
    return pool + spec_checkpoint_reserve_bytes(
        draft.config, max_batch_size, indexer_paged=True, spec_on=True, dtype_bytes=dtype_bytes
    )


def draft_kv_bytes_per_token(draft: DraftInputs, dtype_bytes: int) -> int:
    """One token of the draft's paged K/V across its layers."""
    return kv_bytes_per_token(draft.config, dtype_bytes, indexer_paged=True)


def mtp_cache_spec(config: ModelConfig) -> LayerCacheSpec:
    """The paged cache of the MTP layer speculation runs (the first): a target layer's spec of
    its type (unnamed: a DSA layer's, else layer 0's), K/V at the serve dtype. A DSA layer pages
    only its latent: its indexer is per sequence, the proposer's state
    (:func:`~metrale_model_arch.memory.seq_state_reserve.per_sequence_state_bytes`)."""
    if config.mtp is None:
        raise ValueError(f"{config.source}: {config.model_type} has no MTP layers")
    specs = cache_specs(config, indexer_paged=True)
    kinds, layer_types = config.mtp.layer_types, config.layer_types
    # Unnamed, a model with DSA layers drafts with one (GLM-5.3's MTP layer is DSA).
    kind = kinds[0] if kinds else SPARSE_ATTENTION
    spec = specs[layer_types.index(kind)] if kind in layer_types else specs[0]
    return spec.latent if isinstance(spec, SparseAttentionSpec) else spec


def mtp_kv_bytes_per_token(config: ModelConfig, dtype_bytes: int) -> int:
    """One token of the MTP layer's paged K/V (the draft pool of method ``mtp``)."""
    return mtp_cache_spec(config).paged_bytes_per_token(dtype_bytes)
