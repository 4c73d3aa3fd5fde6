"""The dense families whose layers depart from llama's: olmo2, granite, smollm3, phi3, gemma2,
gemma3_text, as one module switched by the config (:class:`~metrale_config.ModelConfig`'s
``norm_layout`` ... ``local_rope_theta``).

- olmo2: norms after attention and the MLP (``NormLayout.POST``), q/k RMSNorm over the whole
  projection; granite: the embedding, residual and logit multipliers, ``attention_multiplier``
  as the softmax scale; smollm3: NoPE layers; phi3: partial rotary, LongRoPE (checkpoints hold
  the fused ``qkv_proj`` and ``gate_up_proj`` this module has anyway);
- gemma2 / gemma3_text: ``(1 + w)`` RMSNorms before and after attention and the MLP
  (``NormLayout.SANDWICH``), embeddings times sqrt(hidden) in the model dtype, GELU (tanh),
  ``query_pre_attn_scalar``, sliding-window layers (gemma3's with their own RoPE base), soft-capped
  attention scores and logits (gemma2), per-head q/k norms (gemma3).

Parameter names are transformers'. It is no ``LlamaForCausalLM``: its layers run eagerly (a
:class:`~metrale_model_arch.families.decoder_stack.DecoderStack`), never through the compiled or
native llama executors, which compute llama's layer only.

A LongRoPE model (phi3) takes its long factors when served past its original context, its short
ones within it (:mod:`~metrale_model_arch.families.rotary` says what that means for a sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import nn
from torch.nn import functional

from metrale_config import ModelConfig, NormLayout
from metrale_kernels import AttentionMetadata, KernelBackend
from metrale_kernels.reference.row_invariant_attention import row_invariant_attention
from metrale_model_arch.cache_spec import layer_sliding_window
from metrale_model_arch.families.base import LayerCache
from metrale_model_arch.families.decoder_stack import DecoderStack, EagerCausalLM
from metrale_model_arch.families.llama import (
    UNSUPPORTED_FEATURES,
    LlamaAttention,
    LlamaMLP,
    RMSNorm,
    check_supported,
    qkv_sizes,
)
from metrale_model_arch.families.rotary import rope_cos_sin_table
from metrale_model_arch.families.row_invariant_layers import head_logits
from metrale_model_arch.rope_layout import local_table_index, rotary_dim

HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")


class OffsetRMSNorm(RMSNorm):
    """RMSNorm scaled by ``offset + weight`` in float32, cast after (gemma's ``1 + w``; olmo2's
    float32 product)."""

    def __init__(self, size: int, eps: float, backend: KernelBackend, offset: float) -> None:
        super().__init__(size, eps, backend)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * (self.offset + self.weight.to(torch.float32))).to(x.dtype)


def make_norm(config: ModelConfig, size: int, backend: KernelBackend) -> RMSNorm:
    # olmo2 and gemma multiply in float32 before the cast; llama's layout casts first.
    if config.norm_layout == NormLayout.PRE:
        return RMSNorm(size, config.rms_norm_eps, backend)
    return OffsetRMSNorm(size, config.rms_norm_eps, backend, config.norm_weight_offset)


class VariantAttention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__(config, layer_sliding_window(config, layer_index), backend)
        if config.attention_scale is not None:
            self.scale = config.attention_scale
        self.softcap = config.attn_logit_softcapping
        self.uses_rope = layer_index not in config.nope_layers
        self.reads_local_table = (
            local_table_index(config) is not None and self.sliding_window is not None
        )
        self.rotary_dim = rotary_dim(config)
        self.qk_norm_per_head = config.qk_norm_per_head
        if config.qk_norm:
            q_size, kv_size = qkv_sizes(config)
            if config.qk_norm_per_head:
                q_size = kv_size = self.head_dim
            self.q_norm = make_norm(config, q_size, backend)
            self.k_norm = make_norm(config, kv_size, backend)

    def project_qkv(
        self, hidden: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``positions`` are rows of ``cos_sin`` (the table already chosen)."""
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.qkv_split, dim=-1)
        if self.q_norm is not None and self.k_norm is not None and not self.qk_norm_per_head:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None and self.qk_norm_per_head:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotate(q, k, positions, cos_sin)
        return q, k, v

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE over the leading ``rotary_dim`` dims of each head of ``q`` and ``k``."""
        if not self.uses_rope:
            return q, k
        dim = self.rotary_dim
        if dim == self.head_dim:
            return self.backend.apply_rotary(q, k, positions, cos_sin)
        q_rot, k_rot = self.backend.apply_rotary(
            q[..., :dim].contiguous(), k[..., :dim].contiguous(), positions, cos_sin
        )
        return torch.cat((q_rot, q[..., dim:]), -1), torch.cat((k_rot, k[..., dim:]), -1)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        if self.softcap is None:
            return super().attend(q, k, v, kv_cache, metadata)
        # No kernel backend soft-caps scores (SDPA cannot): the row-invariant torch path does.
        metadata = metadata.for_window(self.sliding_window)
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        return row_invariant_attention(
            q, k_cache, v_cache, metadata, self.scale, self.sliding_window, softcap=self.softcap
        )


class VariantMLP(LlamaMLP):
    """The gated MLP with the config's activation on the gate half (SiLU or tanh GELU)."""

    def __init__(self, config: ModelConfig, backend: KernelBackend) -> None:
        super().__init__(config, backend)
        self.is_gelu = config.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.is_gelu:
            return super().forward(x)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out: torch.Tensor = self.down_proj(functional.gelu(gate, approximate="tanh") * up)
        return out


class VariantDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, backend: KernelBackend) -> None:
        super().__init__()
        self.self_attn = VariantAttention(config, layer_index, backend)
        self.mlp = VariantMLP(config, backend)
        self.residual_multiplier = config.residual_multiplier
        layout, hidden = config.norm_layout, config.hidden_size
        # transformers' names: llama's two norms, olmo2's two after, gemma's four.
        self.input_layernorm: RMSNorm | None = None
        self.pre_feedforward_layernorm: RMSNorm | None = None
        self.post_feedforward_layernorm: RMSNorm | None = None
        if layout != NormLayout.POST:
            self.input_layernorm = make_norm(config, hidden, backend)
        self.post_attention_layernorm = make_norm(config, hidden, backend)
        if layout == NormLayout.SANDWICH:
            self.pre_feedforward_layernorm = make_norm(config, hidden, backend)
        if layout != NormLayout.PRE:
            self.post_feedforward_layernorm = make_norm(config, hidden, backend)
        self.is_post_attention_norm_after = layout != NormLayout.PRE

    def forward(
        self,
        hidden: torch.Tensor,
        rope_rows: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        attention = self.self_attn
        normed = hidden if self.input_layernorm is None else self.input_layernorm(hidden)
        q, k, v = attention.project_qkv(normed, rope_rows, cos_sin)
        attended = attention.attend(q, k, v, kv_cache, metadata)
        out = attention.o_proj(attended.reshape(hidden.shape[0], -1))
        if self.is_post_attention_norm_after:
            out = self.post_attention_layernorm(out)
        hidden = self.add_residual(hidden, out)
        if self.pre_feedforward_layernorm is not None:
            normed = self.pre_feedforward_layernorm(hidden)
        elif not self.is_post_attention_norm_after:
            normed = self.post_attention_layernorm(hidden)
        else:
            normed = hidden
        out = self.mlp(normed)
        if self.post_feedforward_layernorm is not None:
            out = self.post_feedforward_layernorm(out)
        return self.add_residual(hidden, out)

    def add_residual(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.residual_multiplier != 1.0:
            out = out * self.residual_multiplier
        return hidden + out


class DenseVariantForCausalLM(EagerCausalLM):
    """Model types ``olmo2``, ``granite``, ``smollm3``, ``phi3``, ``gemma2``, ``gemma3_text``
    (see :class:`CausalLM` and this module's docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__(config, max_seq_len=max_seq_len, backend=backend)
        self.embedding_multiplier = config.embedding_multiplier
        self.local_table = local_table_index(config)

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_supported(config, UNSUPPORTED_FEATURES, hidden_acts=HIDDEN_ACTS, layer_variants=True)

    def build_model(self) -> DecoderStack:
        config, backend = self.config, self.backend
        # cos_sin_cache: (tables * max_seq_len, rotary_dim) (``rope_layout``).
        return DecoderStack(
            config,
            (VariantDecoderLayer(config, i, backend) for i in range(config.num_hidden_layers)),
            make_norm(config, config.hidden_size, backend),
            rope_cos_sin_table(config, self.max_seq_len),
        )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = super().embed(input_ids)
        if self.embedding_multiplier != 1.0:
            multiplier = torch.tensor(
                self.embedding_multiplier, dtype=hidden.dtype, device=hidden.device
            )
            hidden = hidden * multiplier
        return hidden

    def rope_rows(self, positions: torch.Tensor) -> list[torch.Tensor]:
        if self.local_table is None:
            return [positions] * len(self.model.layers)
        local_positions = positions + self.local_table * self.max_seq_len
        layers = cast("Sequence[VariantDecoderLayer]", self.model.layers)
        return [
            local_positions if layer.self_attn.reads_local_table else positions for layer in layers
        ]

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        config = self.config
        cap = config.final_logit_softcapping
        if config.logits_scaling == 1.0 and cap is None:
            return head_logits(self.lm_head, hidden, out)
        logits = head_logits(self.lm_head, hidden, None)
        if config.logits_scaling != 1.0:
            logits = logits / config.logits_scaling
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits if out is None else out.copy_(logits)
