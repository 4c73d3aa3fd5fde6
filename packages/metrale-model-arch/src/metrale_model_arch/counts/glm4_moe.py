"""Weight plan of GLM-4.5 / 4.6 (``glm4_moe``).

Attention, norms, embeddings and head are the llama family's (q/k/v biases, per-head q/k
norms); a dense layer holds a SwiGLU MLP of ``intermediate_size``; a sparse one the routed
experts and the shared experts at the serve dtype, the router and its score-correction bias in
float32. Each MTP layer is one more decoder layer plus ``enorm``, ``hnorm``, ``eh_proj`` and
``shared_head.norm``, counted in ``mtp`` / ``mtp_fp32`` (its copies of the embedding and head
are not loaded).
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.glm5_next import SplitParams
from metrale_model_arch.counts.llama import llama_param_counts
from metrale_model_arch.counts.moe import (
    SPARSE,
    require_moe,
    routed_experts_params,
    router_params,
    swiglu_mlp_params,
)


def glm4_moe_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``Glm4MoeForCausalLM`` builds it, MTP layers included."""
    moe = require_moe(config)
    # The llama plan with a zero-width MLP: embeddings, attention and norms, final norm, head.
    without_mlp = llama_param_counts(attrs.evolve(config, intermediate_size=0, mlp_bias=False))
    attention_and_norms = without_mlp.layers // config.num_hidden_layers
    layers = SplitParams()
    for kind in moe.mlp_layer_types:
        layers += _mlp_params(config, kind) + SplitParams(serve=attention_and_norms)
    mtp = SplitParams()
    if config.mtp is not None:
        hidden = config.hidden_size
        # enorm, hnorm, shared_head.norm and eh_proj (hidden, 2 * hidden).
        own = 3 * hidden + 2 * hidden * hidden
        for kind in config.mtp.mlp_layer_types:
            mtp += _mlp_params(config, kind) + SplitParams(serve=attention_and_norms + own)
    return ParamCounts(
        embeddings=without_mlp.embeddings,
        layers=layers.serve,
        final_norm=without_mlp.final_norm,
        lm_head=without_mlp.lm_head,
        layers_fp32=layers.fp32,
        mtp=mtp.serve,
        mtp_fp32=mtp.fp32,
    )


def _mlp_params(config: ModelConfig, kind: str) -> SplitParams:
    moe = require_moe(config)
    hidden = config.hidden_size
    if kind != SPARSE:
        return SplitParams(serve=swiglu_mlp_params(hidden, config.intermediate_size))
    shared = swiglu_mlp_params(hidden, moe.moe_intermediate_size * moe.num_shared_experts)
    return SplitParams(
        serve=routed_experts_params(hidden, moe) + shared,
        fp32=router_params(hidden, moe) + moe.num_experts,
    )
