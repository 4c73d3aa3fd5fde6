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
from metrale_model_arch.memory.dsa_state import dsa_capacity, indexer_state_bytes
from metrale_model_arch.memory.glm5_next_skeleton import (
    GLM5_NEXT_MODEL_TYPES,
    Glm5NextTextSkeleton,
    Mixer,
)

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

    Zero for every model without DSA layers (every model but GLM-5.3, ``glm5_next`` or its flat
    text form ``glm5_next_text``). ``spec_on`` gates the proposer term: with speculation off no
    proposer exists. With ``indexer_paged`` the target layers' indexer lives in the KV pool
    (priced per token there), so nothing is charged for it here.
    """
    if config.model_type not in GLM5_NEXT_MODEL_TYPES or config.dsa is None:
        return PerSequenceState()
    capacity = dsa_capacity(max_seq_len, config.dsa.index_kpool)
    per_layer = indexer_state_bytes(capacity, config.dsa.index_head_dim)
    skeleton = Glm5NextTextSkeleton.from_config(config)
    target_layers = 0 if indexer_paged else skeleton.num_layers_with(Mixer.DSA) * per_layer
    has_sparse_drafter = config.mtp is not None and SPARSE_ATTENTION in config.mtp.layer_types
    proposer = 0
    if spec_on and has_sparse_drafter:
        hidden = config.hidden_size
        proposer = (
            per_layer  # the drafter layer's own DSA indexer block
            + 2 * hidden * BF16_BYTES  # concat of embedding and hidden state
            + hidden * BF16_BYTES  # x
            + config.vocab_size * BF16_BYTES  # logits
            + PROPOSER_ARG_BYTES
            + PROPOSER_HEAD_XCHG_BYTES
        )
    return PerSequenceState(target_layers=target_layers, proposer=proposer)
