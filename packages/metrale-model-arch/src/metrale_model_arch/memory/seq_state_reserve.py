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

import math
from typing import Literal

import attrs

from metrale_config import SPARSE_ATTENTION, ModelConfig
from metrale_model_arch.cache_spec import FlatIndexerSpec
from metrale_model_arch.memory.state_pools import state_bytes_per_slot
from metrale_model_arch.owners import PER_SEQUENCE_STATE
from metrale_model_arch.registry import cache_specs

BF16_BYTES = 2
ProposerDtype = Literal["float32", "uint8", "bfloat16", "int32"]
PROPOSER_DTYPE_BYTES: dict[str, int] = {"float32": 4, "uint8": 1, "bfloat16": 2, "int32": 4}
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


@attrs.frozen(kw_only=True)
class ProposerBuffer:
    """One tensor of the MTP proposer's per-sequence state: ``shape`` per sequence."""

    role: str
    shape: tuple[int, ...]
    dtype: ProposerDtype

    def bytes_per_slot(self) -> int:
        return math.prod(self.shape) * PROPOSER_DTYPE_BYTES[self.dtype]


def drafts_with_dsa(config: ModelConfig) -> bool:
    """Whether ``config``'s MTP drafter is a DSA layer (with its own indexer): its first MTP
    layer is sparse attention, or unnamed in a model with DSA layers (GLM-5.3's)."""
    if config.mtp is None or config.dsa is None:
        return False
    kinds = config.mtp.layer_types or (SPARSE_ATTENTION,)
    return kinds[0] == SPARSE_ATTENTION


def proposer_buffers(config: ModelConfig, max_seq_len: int) -> tuple[ProposerBuffer, ...]:
    """The MTP proposer's per-sequence tensors at a ``max_seq_len`` context, seed 003's
    ``Glm5NextMtpHead::alloc_state``: the drafter layer's own flat DSA indexer (its keys and
    flag bytes, whatever the target's indexer layout) and five fixed buffers (concat of the
    embedding and hidden state, x, logits, arg, head_xchg). None for a drafter without DSA."""
    if not drafts_with_dsa(config):
        return ()
    assert config.dsa is not None
    indexer = FlatIndexerSpec(
        index_head_dim=config.dsa.index_head_dim, index_kpool=config.dsa.index_kpool
    ).state(max_seq_len)
    hidden = config.hidden_size
    return (
        *(
            ProposerBuffer(
                role=t.role, shape=t.shape, dtype="uint8" if t.dtype == "uint8" else "float32"
            )
            for t in indexer
        ),
        ProposerBuffer(role="concat", shape=(2 * hidden,), dtype="bfloat16"),
        ProposerBuffer(role="x", shape=(hidden,), dtype="bfloat16"),
        ProposerBuffer(role="logits", shape=(config.vocab_size,), dtype="bfloat16"),
        ProposerBuffer(role="arg", shape=(PROPOSER_ARG_BYTES // 4,), dtype="int32"),
        ProposerBuffer(role="head_xchg", shape=(PROPOSER_HEAD_XCHG_BYTES,), dtype="uint8"),
    )


def per_sequence_state_bytes(
    config: ModelConfig,
    max_seq_len: int,
    spec_on: bool,
    *,
    indexer_paged: bool = False,
    dtype_bytes: int = BF16_BYTES,
) -> PerSequenceState:
    """Per-sequence owned device state of ``config`` at a ``max_seq_len`` context.

    ``target_layers`` is what the layers' cache specs hold per sequence (the flat DSA indexer;
    zero with ``indexer_paged``, where the indexer lives in the KV pool and is priced per token
    there). ``spec_on`` (MTP speculation) gates the proposer term: with it off no proposer
    exists; with it on, a DSA drafter owns :func:`proposer_buffers`. ``dtype_bytes``, the
    serve dtype's, widens the indexer keys only at float64.

    NOTE: the proposer term is the same in both indexer layouts. The drafter's indexer is the
    proposer's own state (seed 003), flat even when the target's is paged: at GLM-5.3's
    default config that is 513 B per token of context per sequence (67.2 MB at 128k), against
    11 times that for the target's layers, which is why only theirs is paged by default.
    """
    specs = cache_specs(config, indexer_paged=indexer_paged)
    target_layers = state_bytes_per_slot(specs, PER_SEQUENCE_STATE, max_seq_len, dtype_bytes)
    proposer = 0
    if spec_on:
        proposer = sum(buffer.bytes_per_slot() for buffer in proposer_buffers(config, max_seq_len))
    return PerSequenceState(target_layers=target_layers, proposer=proposer)
