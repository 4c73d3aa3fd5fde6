"""The contract every model family implements."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend

# One layer's paged caches, in its cache spec's role order: ``(k_cache, v_cache)`` for full and
# sliding attention, ``(latent,)`` for MLA, ``(latent, index_keys)`` for a paged DSA layer,
# ``()`` for a layer with nothing paged.
LayerCache = tuple[torch.Tensor, ...]
# One layer's per-sequence state tensors, in its cache spec's state order, each ``(slots,
# *shape)`` (``metadata.state_slots`` says which slot each sequence of a step reads and updates):
# ``(recurrent, conv)`` for linear attention, ``(index_keys, index_flags)`` for a flat DSA
# indexer, ``()`` for a layer without state.
LayerState = tuple[torch.Tensor, ...]
KvCache = tuple[torch.Tensor, torch.Tensor]


class CausalLM(nn.Module):
    """A decoder-only language model that reads and writes a paged KV cache.

    Construction takes the config alone (``max_seq_len`` sizes the precomputed position
    tables; ``backend`` supplies the ops). Parameter names are Hugging Face's, so a
    checkpoint's tensors load by name. One ``forward`` serves prefill, chunked prefill and
    decode: every attention layer writes the step's K/V at ``metadata.slot_mapping``, then
    attends over each sequence's cached context.
    """

    config: ModelConfig
    max_seq_len: int
    backend: KernelBackend

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
    ) -> torch.Tensor:
        """Hidden states ``(tokens, hidden_size)`` after the final norm.

        ``input_ids`` and ``positions`` are ``(tokens,)`` int64 in ``metadata``'s token order;
        ``kv_caches`` has one :data:`LayerCache` per layer (a ``KvCachePool``); for attention
        layers ``(k_cache, v_cache)``, each ``(num_blocks, block_size, num_kv_heads, head_dim)``.
        They are written in place. ``states`` (a ``StateSlots``, or empty for a model without
        per-sequence state) has one :data:`LayerState` per layer, read and updated in place at
        ``metadata.state_slots``.
        """
        raise NotImplementedError

    @property
    def executor_name(self) -> str:
        """How its layers' steps run now: ``eager``, unless the family takes layer executors
        (the llama family: ``compiled``, ``native``) and the engine installed one."""
        return "eager"

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``(n, hidden)`` final hidden states → ``(n, vocab_size)`` logits, written into
        ``out`` (``(n, vocab_size)``, the model's dtype) when given."""
        raise NotImplementedError

    @property
    def num_mtp_layers(self) -> int:
        """Multi-token-prediction layers loaded beside the stack (0: the family runs none)."""
        return 0

    def forward_mtp(
        self,
        input_ids: torch.Tensor,
        previous_hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
        state: LayerState = (),
    ) -> torch.Tensor:
        """The first MTP layer over ``(tokens,)`` rows: ``input_ids[j]`` is the token after
        the position whose hidden state is ``previous_hidden[j]`` (the target's final hidden
        state there, or this layer's own output one position earlier), at ``positions[j]``;
        ``kv_cache`` is the layer's own paged cache, written in place, ``state`` its
        per-sequence state at ``metadata.state_slots`` (a DSA layer's flat indexer). Returns
        the block's output ``h'`` ``(tokens, hidden_size)``: ``compute_mtp_logits`` takes it,
        and so does the next application as ``previous_hidden``."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP layers")

    def compute_mtp_logits(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``forward_mtp``'s ``h'`` → logits: the target's LM head over ``shared_head.norm``."""
        raise NotImplementedError(f"{type(self).__name__} has no MTP layers")
