"""Weight plan of GLM-5.3 (``glm5_next``): the text stack, the LM head and the vision tower.

Each layer holds two hyper-connections (before the mixer and before the FFN), two RMSNorms, a
mixer (DSA: MLA plus, on "full" layers, an indexer; or KDA linear attention) and an FFN (a dense
SwiGLU MLP, or the MoE: routed experts, a router and shared experts). Parameters transformers
creates in float32 whatever the serve dtype (the router and its score-correction bias, the
hyper-connections' ``base`` and
``scale``, KDA's ``conv1d``, ``dt_bias`` and ``A_log``) are counted in ``layers_fp32``. The MTP
layers the config declares are counted in ``mtp`` / ``mtp_fp32`` (a DSA decoder layer over one
stream with its own indexer, ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``); the
vision tower, when the config declares one, in ``vision`` (:mod:`.glm5_next_vision`).
"""

from __future__ import annotations

from typing import TypeVar

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.glm5_next_vision import vision_tower_params
from metrale_model_arch.counts.moe import (
    require_moe,
    routed_experts_params,
    router_params,
    swiglu_mlp_params,
)
from metrale_model_arch.glm5_next_skeleton import (
    Ffn,
    Glm5NextTextSkeleton,
    Mixer,
    SkeletonLayer,
)

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class SplitParams:
    """Parameters at the serve dtype and parameters kept in float32."""

    serve: int = 0
    fp32: int = 0

    def __add__(self, other: SplitParams) -> SplitParams:
        return SplitParams(serve=self.serve + other.serve, fp32=self.fp32 + other.fp32)


def glm5_next_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as transformers' ``Glm5NextTextModel`` plus a bias-free ``Linear`` LM head, and
    its ``Glm5NextVisionModel`` where the config has one."""
    skeleton = Glm5NextTextSkeleton.from_config(config)
    layers = SplitParams()
    for layer in skeleton.layers:
        layers += decoder_layer_params(config, layer)
    embeddings = config.vocab_size * config.hidden_size
    mtp = SplitParams()
    if config.mtp is not None:
        one_stream = attrs.evolve(
            config, mhc=attrs.evolve(_section(config, config.mhc, "MHC"), num_streams=1)
        )
        hidden = config.hidden_size
        own = SplitParams(serve=3 * hidden + 2 * hidden * hidden)  # norms and eh_proj
        for k in range(config.mtp.num_layers):
            mtp += decoder_layer_params(one_stream, mtp_layer(config, k)) + own
    return ParamCounts(
        embeddings=embeddings,
        layers=layers.serve,
        final_norm=config.hidden_size,
        lm_head=0 if config.tie_word_embeddings else embeddings,
        layers_fp32=layers.fp32,
        vision=vision_tower_params(config.vision) if config.vision is not None else 0,
        mtp=mtp.serve,
        mtp_fp32=mtp.fp32,
    )


def mtp_layer(config: ModelConfig, k: int) -> SkeletonLayer:
    """MTP layer ``k``'s block: a DSA layer with its own indexer, its FFN the MoE unless the
    config names it dense."""
    assert config.mtp is not None
    ffns = config.mtp.mlp_layer_types
    ffn = Ffn.DENSE if k < len(ffns) and ffns[k] == "dense" else Ffn.MOE
    index = config.num_hidden_layers + k
    return SkeletonLayer(index=index, mixer=Mixer.DSA, ffn=ffn, has_own_indexer=True)


def decoder_layer_params(config: ModelConfig, layer: SkeletonLayer) -> SplitParams:
    if layer.mixer is Mixer.DSA:
        mixer = SplitParams(serve=dsa_attention_params(config, layer.has_own_indexer))
    else:
        mixer = kda_attention_params(config)
    ffn = moe_params(config) if layer.ffn is Ffn.MOE else dense_mlp_params(config)
    norms = SplitParams(serve=2 * config.hidden_size)
    hyper_connections = hyper_connection_params(config) + hyper_connection_params(config)
    return mixer + ffn + norms + hyper_connections


def hyper_connection_params(config: ModelConfig) -> SplitParams:
    """``fn`` (serve dtype) maps the flattened streams to pre/post/comb; ``base``, ``scale``."""
    streams = _section(config, config.mhc, "MHC").num_streams
    num_weights = (2 + streams) * streams
    return SplitParams(serve=num_weights * streams * config.hidden_size, fp32=num_weights + 3)


def dsa_attention_params(config: ModelConfig, has_own_indexer: bool) -> int:
    mla = _section(config, config.mla, "MLA")
    if mla.q_lora_rank is None:
        raise ValueError(f"{config.source}: glm5_next needs q_lora_rank (its indexer reads it)")
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_a_width = mla.kv_lora_rank + mla.qk_rope_head_dim
    params = (
        hidden * mla.q_lora_rank  # q_a_proj
        + mla.q_lora_rank  # q_a_layernorm
        + mla.q_lora_rank * heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)  # q_b_proj
        + hidden * kv_a_width  # kv_a_proj_with_mqa
        + mla.kv_lora_rank  # kv_a_layernorm
        + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)  # kv_b_proj
        + heads * mla.v_head_dim * hidden  # o_proj
    )
    if config.qkv_bias:
        params += mla.q_lora_rank + kv_a_width
    if config.o_proj_bias:
        params += hidden
    if has_own_indexer:
        params += indexer_params(config, mla.q_lora_rank)
    return params


def indexer_params(config: ModelConfig, q_lora_rank: int) -> int:
    dsa = _section(config, config.dsa, "DSA")
    hidden, head_dim, heads = config.hidden_size, dsa.index_head_dim, dsa.index_n_heads
    return (
        q_lora_rank * heads * head_dim  # wq_b
        + hidden * head_dim  # wk
        + 2 * head_dim  # k_norm (LayerNorm: weight and bias)
        + hidden * heads  # weights_proj
        + dsa.index_kpool * head_dim  # index_kpool_compress_ape
        + head_dim * hidden  # index_kpool_compress_gate
    )


def kda_attention_params(config: ModelConfig) -> SplitParams:
    linear = _section(config, config.linear_attention, "linear attention")
    hidden, head_dim, heads = config.hidden_size, linear.head_dim, linear.num_heads
    qkv_dim = heads * head_dim
    serve = (
        3 * hidden * qkv_dim  # q_proj, k_proj, v_proj
        + 2 * (hidden * head_dim + head_dim * qkv_dim)  # forget gate f_a/f_b, output gate g_a/g_b
        + hidden * heads  # b_proj
        + head_dim  # o_norm
        + qkv_dim * hidden  # o_proj
    )
    # Depthwise conv1d over q, k and v (no bias), forget gate dt_bias and A_log.
    fp32 = 3 * qkv_dim * linear.conv_kernel_dim + qkv_dim + heads
    return SplitParams(serve=serve, fp32=fp32)


def dense_mlp_params(config: ModelConfig) -> SplitParams:
    return SplitParams(serve=swiglu_mlp_params(config.hidden_size, config.intermediate_size))


def moe_params(config: ModelConfig) -> SplitParams:
    moe = require_moe(config)
    hidden = config.hidden_size
    shared_intermediate = moe.moe_intermediate_size * moe.num_shared_experts
    serve = routed_experts_params(hidden, moe) + swiglu_mlp_params(hidden, shared_intermediate)
    # The router's score-correction bias is a float32 buffer the checkpoint carries.
    return SplitParams(serve=serve, fp32=router_params(hidden, moe) + moe.num_experts)


def _section(config: ModelConfig, section: T | None, name: str) -> T:
    if section is None:
        raise ValueError(f"{config.source}: a glm5_next config needs {name} fields")
    return section
