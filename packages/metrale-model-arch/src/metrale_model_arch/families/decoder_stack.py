"""The eager decoder stack of the families whose layers are no llama layer (deepseek, gpt_oss,
glm4_moe, the dense variants): an embedding, the layers, a final norm and the RoPE table
(:class:`DecoderStack`, ``model.*`` in a checkpoint) under an LM head (:class:`EagerCausalLM`),
every layer run in turn over its paged cache. No layer executor takes them: the compiled and
native executors compute llama's layer only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import cast

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend, TorchBackend
from metrale_model_arch.families.base import CausalLM, LayerCache, LayerState
from metrale_model_arch.families.llama import LlamaAttention
from metrale_model_arch.families.row_invariant_layers import head_logits


class PreNormDecoderLayer(nn.Module):
    """``h += attention(input_layernorm(h))``, then ``h += mlp(post_attention_layernorm(h))``.

    A subclass makes the four modules; ``attention`` runs a llama attention (``project_qkv``,
    ``attend``, ``o_proj``) unless the subclass overrides it.
    """

    self_attn: nn.Module
    mlp: nn.Module
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        hidden = hidden + self.attention(normed, positions, cos_sin, kv_cache, metadata)
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out

    def attention(
        self,
        normed: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """The attention block's output ``(tokens, hidden)``; the step's K/V written to
        ``kv_cache``."""
        attention = cast("LlamaAttention", self.self_attn)
        q, k, v = attention.project_qkv(normed, positions, cos_sin)
        attended = attention.attend(q, k, v, kv_cache, metadata)
        out: torch.Tensor = attention.o_proj(attended.reshape(normed.shape[0], -1))
        return out


class DecoderStack(nn.Module):
    """``embed_tokens``, ``layers``, ``norm`` and the ``cos_sin_cache`` buffer (a family's RoPE
    table, float32, never in a checkpoint). ``layers`` is consumed after the embedding is made,
    so a generator builds them in the order their parameters were always created."""

    def __init__(
        self,
        config: ModelConfig,
        layers: Iterable[nn.Module],
        norm: nn.Module,
        cos_sin_cache: torch.Tensor,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", cos_sin_cache, persistent=False)


class EagerCausalLM(CausalLM):
    """A :class:`CausalLM` over a :class:`DecoderStack` and an untied or tied LM head.

    A family overrides ``check_config`` (raise ``ValueError`` naming what it cannot run) and
    ``build_model``; ``embed``, ``rope_rows`` and ``compute_logits`` where its model departs
    from the plain stack. Every layer is called ``layer(hidden, rows, cos_sin, kv_cache,
    metadata)``.
    """

    model: DecoderStack

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__()
        self.check_config(config)
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.backend = backend if backend is not None else TorchBackend()
        self.model = self.build_model()
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        raise NotImplementedError

    def build_model(self) -> DecoderStack:
        """The stack for ``self.config`` at ``self.max_seq_len`` over ``self.backend``."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
        states: Sequence[LayerState] = (),
    ) -> torch.Tensor:
        del states  # no per-sequence state
        layers = self.model.layers
        if len(kv_caches) != len(layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(layers)} layers")
        cos_sin = self.model.cos_sin_cache
        hidden = self.embed(input_ids)
        for layer, rows, kv_cache in zip(layers, self.rope_rows(positions), kv_caches, strict=True):
            hidden = layer(hidden, rows, cos_sin, kv_cache, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``(tokens,)`` ids -> the first layer's input ``(tokens, hidden)``."""
        out: torch.Tensor = self.model.embed_tokens(input_ids)
        return out

    def rope_rows(self, positions: torch.Tensor) -> Iterable[torch.Tensor]:
        """Each layer's rows of ``cos_sin_cache``: ``positions`` for every layer of a family
        with one table."""
        return itertools.repeat(positions, len(self.model.layers))

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return head_logits(self.lm_head, hidden, out)
