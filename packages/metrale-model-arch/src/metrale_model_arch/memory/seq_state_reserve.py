"""Per-sequence device state the serve must reserve, computed before the model exists.

Charged: device memory a sequence owns that no other term covers: the target stack's DSA
indexer caches (one per DSA layer of GLM-5.3, when the indexer is flat rather than paged in the
KV pool) and the draft proposer's own state, a separate owner that never appears in the layer
list. Not charged, because another term already holds it: linear-attention recurrent and conv
state (the linear-state pool), the paged KV pool (the budget this reserve is subtracted from),
the buffer arena (sized by ``max_batch_tokens``), and transient per-step scratch (runtime
headroom). The indexer cache is replicated across ranks: these are per-rank bytes.
"""

from __future__ import annotations

import attrs

from metrale_config import SPARSE_ATTENTION, ModelConfig
from metrale_model_arch.cache_spec import FlatIndexerSpec
from metrale_model_arch.memory.state_pools import state_bytes_per_slot
from metrale_model_arch.owners import PER_SEQUENCE_STATE
from metrale_model_arch.registry import cache_specs

BF16_BYTES = 2
# The proposer's small fixed buffers: the sampled argmax (int32) and the head exchange slot.
PROPOSER_ARG_BYTES = 4
PROPOSER_HEAD_XCHG_BYTES = 16


@attrs.frozen
class PerSequenceState:
    """Per-sequence, per-rank device state, split by owner."""

    target_layers: int = 0
    proposer: int = 0

    def total(self) -> int:
        return self.target_layers + self.proposer

    def for_batch(self, max_batch_size: int) -> int:
        """What the reserve holds for ``max_batch_size`` concurrent sequences (0 counts as 1).

        The batch multiplier is applied here, once, so no caller can apply it twice.
        """
        return self.total() * max(max_batch_size, 1)


def per_sequence_state_bytes(
    config: ModelConfig, max_seq_len: int, spec_on: bool, *, indexer_paged: bool = False
) -> PerSequenceState:
    """Per-sequence owned device state of ``config`` at a ``max_seq_len`` context.

    ``target_layers`` is what the layers' cache specs hold per sequence (the flat DSA indexer;
    zero with ``indexer_paged``, where the indexer lives in the KV pool and is priced per token
    there). ``spec_on`` gates the proposer term: with speculation off no proposer exists; with
    it on, a sparse-attention draft layer owns its indexer and its fixed buffers.
    """
    specs = cache_specs(config, indexer_paged=indexer_paged)
    dtype_bytes = BF16_BYTES  # per-sequence tensors have fixed dtypes
    target_layers = state_bytes_per_slot(specs, PER_SEQUENCE_STATE, max_seq_len, dtype_bytes)
    has_sparse_drafter = config.mtp is not None and SPARSE_ATTENTION in config.mtp.layer_types
    proposer = 0
    if spec_on and has_sparse_drafter and config.dsa is not None:
        drafter_indexer = FlatIndexerSpec(
            index_head_dim=config.dsa.index_head_dim, index_kpool=config.dsa.index_kpool
        )
        hidden = config.hidden_size
        proposer = (
            # the drafter layer's own DSA indexer block
            drafter_indexer.state_bytes_per_slot(PER_SEQUENCE_STATE, max_seq_len, dtype_bytes)
            + 2 * hidden * BF16_BYTES  # concat of embedding and hidden state
            + hidden * BF16_BYTES  # x
            + config.vocab_size * BF16_BYTES  # logits
            + PROPOSER_ARG_BYTES
            + PROPOSER_HEAD_XCHG_BYTES
        )
    return PerSequenceState(target_layers=target_layers, proposer=proposer)
