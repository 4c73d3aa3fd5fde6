"""``ModelConfig``: every field the architectures and the memory math read, parsed at the edge."""

from __future__ import annotations

import attrs

from metrale_config.rope import RopeScaling

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LINEAR_ATTENTION = "linear_attention"
SPARSE_ATTENTION = "sparse_attention"


@attrs.frozen(kw_only=True)
class MoeConfig:
    """Mixture-of-experts fields (qwen3_moe, mixtral, glm5_next)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # One entry per layer: "dense" or "sparse".
    mlp_layer_types: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class MlaConfig:
    """Multi-head latent attention: the cache holds ``kv_lora_rank + qk_rope_head_dim`` per token."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@attrs.frozen(kw_only=True)
class DsaConfig:
    """DeepSeek sparse attention indexer fields (``index_*``)."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int
    index_kpool: int = 1
    index_kpool_always_select_tail: bool = True
    # One entry per layer: "full" (own indexer) or "shared".
    indexer_types: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class LinearAttentionConfig:
    """Linear attention (KDA / GatedDeltaNet) fields: per-sequence recurrent + conv state."""

    num_heads: int
    head_dim: int
    conv_kernel_dim: int
    lower_bound: float | None = None


@attrs.frozen(kw_only=True)
class MtpConfig:
    """Multi-token-prediction (draft) layers stored beside the main stack."""

    num_layers: int
    layer_types: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ModelConfig:
    """A model's architecture, as read from ``config.json`` or GGUF metadata.

    Build one with ``ModelConfig.from_hf_config(path)``, ``from_hf_dict(d, source=...)`` or
    ``from_gguf(path)``; derive variants with ``attrs.evolve``. ``layer_types`` always has
    ``num_hidden_layers`` entries.
    """

    source: str
    model_type: str
    architectures: tuple[str, ...] = ()
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    layer_types: tuple[str, ...] = ()
    moe: MoeConfig | None = None
    mla: MlaConfig | None = None
    dsa: DsaConfig | None = None
    linear_attention: LinearAttentionConfig | None = None
    mtp: MtpConfig | None = None
    quantization_method: str | None = None

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads
