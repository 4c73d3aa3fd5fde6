"""Weight plan of Kimi Linear (``kimi_linear``).

Each layer holds two RMSNorms, a mixer (KDA linear attention, counted as GLM-5.3's; or MLA,
counted as DeepSeek's) and an FFN (a dense SwiGLU MLP of ``intermediate_size``, or the MoE:
routed and shared experts, and the router with its score-correction bias in float32). KDA's
convolution, ``dt_bias`` and ``A_log`` are float32 too (``layers_fp32``).
"""

from __future__ import annotations

from metrale_config import LINEAR_ATTENTION, ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.deepseek import mla_attention_params
from metrale_model_arch.counts.glm5_next import (
    SplitParams,
    dense_mlp_params,
    kda_attention_params,
    moe_params,
)
from metrale_model_arch.counts.moe import SPARSE, require_moe


def kimi_linear_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``KimiLinearForCausalLM`` builds it (transformers' and ours)."""
    layers = SplitParams()
    kinds = require_moe(config).mlp_layer_types
    for layer_type, kind in zip(config.layer_types, kinds, strict=True):
        if layer_type == LINEAR_ATTENTION:
            layers += kda_attention_params(config)
        else:
            layers += SplitParams(serve=mla_attention_params(config))
        layers += moe_params(config) if kind == SPARSE else dense_mlp_params(config)
        layers += SplitParams(serve=2 * config.hidden_size)
    embeddings = config.vocab_size * config.hidden_size
    return ParamCounts(
        embeddings=embeddings,
        layers=layers.serve,
        final_norm=config.hidden_size,
        lm_head=0 if config.tie_word_embeddings else embeddings,
        layers_fp32=layers.fp32,
    )
