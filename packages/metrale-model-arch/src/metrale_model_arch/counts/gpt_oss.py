"""Weight plan of gpt-oss (``gpt_oss``).

Embeddings, attention (q/k/v/o biases), norms and head are the llama family's, plus one sink
per attention head; every layer's MLP is ``num_experts`` experts with biases (a fused gate/up
and a down projection each) at the serve dtype, and the router's weight and bias in float32.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.llama import llama_param_counts
from metrale_model_arch.counts.moe import require_moe, routed_experts_params, router_params


def gpt_oss_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``GptOssForCausalLM`` builds it."""
    moe = require_moe(config)
    hidden, inter = config.hidden_size, moe.moe_intermediate_size
    without_mlp = llama_param_counts(attrs.evolve(config, intermediate_size=0, mlp_bias=False))
    expert_biases = moe.num_experts * (2 * inter + hidden)
    per_layer = config.num_attention_heads + routed_experts_params(hidden, moe) + expert_biases
    return ParamCounts(
        embeddings=without_mlp.embeddings,
        layers=without_mlp.layers + config.num_hidden_layers * per_layer,
        final_norm=without_mlp.final_norm,
        lm_head=without_mlp.lm_head,
        layers_fp32=config.num_hidden_layers * (router_params(hidden, moe) + moe.num_experts),
    )
