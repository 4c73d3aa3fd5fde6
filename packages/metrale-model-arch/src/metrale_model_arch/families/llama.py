"""Llama and its close relatives (Mistral, Qwen2, Qwen3) over a paged KV cache.

The variants differ only by config: q/k/v and o biases (Qwen2), a per-head RMSNorm on q and k
before rotary (Qwen3), an explicit ``head_dim``, sliding-window layers, tied embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import AttentionMetadata, KernelBackend, TorchBackend
from metrale_model_arch.cache_spec import layer_sliding_window
from metrale_model_arch.families.base import CausalLM, LayerCache
from metrale_model_arch.families.rotary import rope_cos_sin_table

SUPPORTED_HIDDEN_ACTS = ("silu",)
UNSUPPORTED_FEATURES = ("moe", "mla", "dsa", "linear_attention", "mhc", "swiglu_limit")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, backend: KernelBackend) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.rms_norm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, sliding_window: int | None, backend: KernelBackend
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.sliding_window = sliding_window
        self.backend = backend
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, backend)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, backend)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        # (tokens, heads, head_dim)
        q = self.q_proj(hidden).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.backend.apply_rotary(q, k, positions, cos_sin)
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        attended = self.backend.paged_attention(
            q, k_cache, v_cache, metadata, self.scale, self.sliding_window
        )
        out: torch.Tensor = self.o_proj(attended.reshape(num_tokens, -1))
        return out


class LlamaMLP(nn.Module):
    def __init__(
        self, config: ModelConfig, backend: KernelBackend, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        intermediate = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        out: torch.Tensor = self.down_proj(self.backend.silu_and_mul(gate_up))
        return out


# (config, layer index, backend) -> the layer's MLP: ``(tokens, hidden)`` -> ``(tokens, hidden)``.
MlpFactory = Callable[[ModelConfig, int, KernelBackend], nn.Module]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        sliding_window: int | None,
        backend: KernelBackend,
        mlp: nn.Module,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, sliding_window, backend)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: LayerCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        attended = self.self_attn(
            self.input_layernorm(hidden), positions, cos_sin, kv_cache, metadata
        )
        hidden = hidden + attended
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        max_seq_len: int,
        backend: KernelBackend,
        mlp_factory: MlpFactory,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                config, layer_sliding_window(config, i), backend, mlp_factory(config, i, backend)
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        # (max_seq_len, head_dim) float32; derived from the config, never part of a checkpoint.
        self.cos_sin_cache: torch.Tensor
        self.register_buffer(
            "cos_sin_cache", rope_cos_sin_table(config, max_seq_len), persistent=False
        )


class LlamaForCausalLM(CausalLM):
    """Model types ``llama``, ``mistral``, ``qwen2`` and ``qwen3`` (see :class:`CausalLM`).

    A subclass with another MLP per layer (an MoE block) overrides ``check_config`` and
    ``build_mlp``; attention, norms, embeddings and head stay the same.
    """

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
        self.model = LlamaModel(config, self.max_seq_len, self.backend, self.build_mlp)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_supported(config)

    @staticmethod
    def build_mlp(config: ModelConfig, layer_index: int, backend: KernelBackend) -> nn.Module:
        del layer_index
        return LlamaMLP(config, backend)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[LayerCache],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(self.model.layers)} layers")
        cos_sin = self.model.cos_sin_cache
        hidden = self.model.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            hidden = layer(hidden, positions, cos_sin, kv_cache, metadata)
        out: torch.Tensor = self.model.norm(hidden)
        return out

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            logits: torch.Tensor = self.lm_head(hidden)
            return logits
        return torch.mm(hidden, self.lm_head.weight.t(), out=out)


def check_supported(
    config: ModelConfig, unsupported: tuple[str, ...] = UNSUPPORTED_FEATURES
) -> None:
    """Raise ``ValueError`` naming the first config feature this family cannot run."""
    if config.hidden_act not in SUPPORTED_HIDDEN_ACTS:
        raise ValueError(
            f"unsupported hidden_act {config.hidden_act!r} for {config.model_type}; "
            f"supported: {', '.join(SUPPORTED_HIDDEN_ACTS)}"
        )
    for feature in unsupported:
        if getattr(config, feature, None) is not None:
            raise ValueError(f"{config.model_type}: the llama family does not support {feature}")
    if config.num_attention_heads % config.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({config.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({config.num_key_value_heads})"
        )
