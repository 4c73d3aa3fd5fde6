"""Weight plan of Qwen3-Next (``qwen3_next``), every parameter at the serve dtype.

A layer holds two RMSNorms, a mixer (Gated DeltaNet, or gated attention: the q projection
twice the query width, q/k norms over a head) and an FFN (routed experts, a router, one shared
expert and its one-row gate; or a dense SwiGLU MLP). The MTP layers the config keeps are
counted in ``mtp``: each a gated-attention layer with its FFN, plus the predictor's ``fc``
``(hidden, 2 * hidden)`` and its three RMSNorms (``pre_fc_norm_embedding``,
``pre_fc_norm_hidden``, ``norm``) once.
"""

from __future__ import annotations

from metrale_config import LINEAR_ATTENTION, LinearAttentionConfig, ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.moe import (
    SPARSE,
    require_moe,
    routed_experts_params,
    router_params,
    swiglu_mlp_params,
)


def qwen3_next_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``Qwen3NextForCausalLM`` builds it: the stack as transformers'
    ``Qwen3NextForCausalLM`` holds it, and the MTP layers (``mtp.*``) it leaves out."""
    moe = require_moe(config)
    hidden = config.hidden_size
    shared_size = moe.shared_expert_intermediate_size or moe.moe_intermediate_size
    sparse_mlp = (
        routed_experts_params(hidden, moe)
        + router_params(hidden, moe)
        + swiglu_mlp_params(hidden, shared_size)
        + hidden
    )
    dense_mlp = swiglu_mlp_params(hidden, config.intermediate_size)
    layers = 0
    for kind, mlp_kind in zip(config.layer_types, moe.mlp_layer_types, strict=True):
        if kind == LINEAR_ATTENTION:
            assert config.linear_attention is not None
            layers += gated_deltanet_params(hidden, config.linear_attention)
        else:
            layers += gated_attention_params(config)
        layers += (sparse_mlp if mlp_kind == SPARSE else dense_mlp) + 2 * hidden
    mtp = 0
    if config.mtp is not None:
        mtp = 2 * hidden * hidden + 3 * hidden
        for mlp_kind in config.mtp.mlp_layer_types:
            mtp += gated_attention_params(config) + 2 * hidden
            mtp += sparse_mlp if mlp_kind == SPARSE else dense_mlp
    embeddings = config.vocab_size * hidden
    return ParamCounts(
        embeddings=embeddings,
        layers=layers,
        final_norm=hidden,
        lm_head=0 if config.tie_word_embeddings else embeddings,
        mtp=mtp,
    )


def gated_deltanet_params(hidden: int, linear: LinearAttentionConfig) -> int:
    """in_proj_qkvz, in_proj_ba, the depthwise conv, dt_bias, A_log, the gated norm, out_proj."""
    key_width = linear.num_key_heads * linear.head_dim
    value_width = linear.num_heads * linear.value_head_dim
    channels = 2 * key_width + value_width
    return (
        hidden * (2 * key_width + 2 * value_width)
        + hidden * 2 * linear.num_heads
        + channels * linear.conv_kernel_dim
        + 2 * linear.num_heads
        + linear.value_head_dim
        + value_width * hidden
    )


def gated_attention_params(config: ModelConfig) -> int:
    hidden, head_dim = config.hidden_size, config.head_dim
    q_size = config.num_attention_heads * head_dim
    kv_size = config.num_key_value_heads * head_dim
    projections = hidden * (2 * q_size + 2 * kv_size) + q_size * hidden
    biases = (2 * q_size + 2 * kv_size) * config.qkv_bias + hidden * config.o_proj_bias
    return projections + biases + 2 * head_dim
