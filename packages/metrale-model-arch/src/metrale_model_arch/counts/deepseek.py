"""Weight plan of DeepSeek-V2 / V3 (``deepseek_v2``, ``deepseek_v3``).

Each layer holds MLA attention (``q_proj``, or ``q_a_proj`` + ``q_a_layernorm`` + ``q_b_proj``;
``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``; with ``attention_bias``
biases on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj``), two RMSNorms and an MLP: a
dense SwiGLU MLP of ``intermediate_size``, or the routed and shared experts at the serve dtype
with the router (and V3's score-correction bias) in float32. Each of V3's MTP layers is one
more decoder layer plus ``enorm``, ``hnorm``, ``eh_proj`` and ``shared_head.norm``, counted in
``mtp`` / ``mtp_fp32`` (its copies of the embedding and head are not loaded). V3.2's layers add
the lightning indexer (``wq_b``, ``wk``, the LayerNorm ``k_norm``, ``weights_proj``).
"""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.glm5_next import SplitParams
from metrale_model_arch.counts.moe import (
    SPARSE,
    require_moe,
    routed_experts_params,
    router_params,
    swiglu_mlp_params,
)


def deepseek_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``DeepseekForCausalLM`` builds it, MTP layers included."""
    attention_and_norms = (
        mla_attention_params(config) + _indexer_params(config) + 2 * config.hidden_size
    )
    layers = SplitParams()
    for kind in require_moe(config).mlp_layer_types:
        layers += _mlp_params(config, kind) + SplitParams(serve=attention_and_norms)
    mtp = SplitParams()
    if config.mtp is not None:
        hidden = config.hidden_size
        # enorm, hnorm, shared_head.norm and eh_proj (hidden, 2 * hidden).
        own = 3 * hidden + 2 * hidden * hidden
        for kind in config.mtp.mlp_layer_types:
            mtp += _mlp_params(config, kind) + SplitParams(serve=attention_and_norms + own)
    embeddings = config.vocab_size * config.hidden_size
    return ParamCounts(
        embeddings=embeddings,
        layers=layers.serve,
        final_norm=config.hidden_size,
        lm_head=0 if config.tie_word_embeddings else embeddings,
        layers_fp32=layers.fp32,
        mtp=mtp.serve,
        mtp_fp32=mtp.fp32,
    )


def mla_attention_params(config: ModelConfig) -> int:
    mla = config.mla
    if mla is None:
        raise ValueError(f"{config.source}: model_type {config.model_type!r} needs MLA fields")
    hidden, heads = config.hidden_size, config.num_attention_heads
    q_rows = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    kv_a_width = mla.kv_lora_rank + mla.qk_rope_head_dim
    if mla.q_lora_rank is None:
        query = hidden * q_rows  # q_proj
    else:
        # q_a_proj, q_a_layernorm, q_b_proj
        query = hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * q_rows
        query += mla.q_lora_rank if config.qkv_bias else 0
    params = (
        query
        + hidden * kv_a_width  # kv_a_proj_with_mqa
        + mla.kv_lora_rank  # kv_a_layernorm
        + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)  # kv_b_proj
        + heads * mla.v_head_dim * hidden  # o_proj
    )
    if config.qkv_bias:
        params += kv_a_width
    if config.o_proj_bias:
        params += hidden
    return params


def _indexer_params(config: ModelConfig) -> int:
    dsa, mla = config.dsa, config.mla
    if dsa is None or mla is None or mla.q_lora_rank is None:
        return 0
    heads, dim, hidden = dsa.index_n_heads, dsa.index_head_dim, config.hidden_size
    # wq_b, wk, k_norm (weight and bias), weights_proj
    return mla.q_lora_rank * heads * dim + hidden * dim + 2 * dim + hidden * heads


def _mlp_params(config: ModelConfig, kind: str) -> SplitParams:
    moe = require_moe(config)
    hidden = config.hidden_size
    if kind != SPARSE:
        return SplitParams(serve=swiglu_mlp_params(hidden, config.intermediate_size))
    shared = swiglu_mlp_params(hidden, moe.moe_intermediate_size * moe.num_shared_experts)
    correction_bias = 0 if config.model_type == "deepseek_v2" else moe.num_experts
    return SplitParams(
        serve=routed_experts_params(hidden, moe) + shared,
        fp32=router_params(hidden, moe) + correction_bias,
    )
