"""Weight plans of the routed-expert families, qwen3_moe and mixtral.

Embeddings, attention, norms and head are the llama family's; only the MLP differs. A sparse
layer holds ``num_experts`` experts (a fused gate/up and a down projection each) and a bias-free
router; a dense layer (qwen3_moe's ``mlp_only_layers`` / ``decoder_sparse_step``) holds a SwiGLU
MLP of ``intermediate_size``. Every parameter is at the serve dtype.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig, MoeConfig
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.llama import llama_param_counts

SPARSE = "sparse"


def swiglu_mlp_params(hidden_size: int, intermediate_size: int) -> int:
    """Gate, up and down projections without bias."""
    return 3 * hidden_size * intermediate_size


def routed_experts_params(hidden_size: int, moe: MoeConfig) -> int:
    """All routed experts of one layer, without their router."""
    return moe.num_experts * swiglu_mlp_params(hidden_size, moe.moe_intermediate_size)


def router_params(hidden_size: int, moe: MoeConfig) -> int:
    return moe.num_experts * hidden_size


def require_moe(config: ModelConfig) -> MoeConfig:
    """The config's MoE section, with one ``mlp_layer_types`` entry per layer."""
    moe = config.moe
    if moe is None:
        raise ValueError(f"{config.source}: model_type {config.model_type!r} needs MoE fields")
    if len(moe.mlp_layer_types) != config.num_hidden_layers:
        raise ValueError(
            f"{config.source}: moe.mlp_layer_types has {len(moe.mlp_layer_types)} entries "
            f"for {config.num_hidden_layers} layers"
        )
    return moe


def qwen3_moe_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``Qwen3MoeForCausalLM`` builds it, dense layers where ``mlp_layer_types`` says."""
    return _routed_moe_param_counts(config)


def mixtral_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``MixtralForCausalLM`` builds it (every layer sparse)."""
    return _routed_moe_param_counts(config)


def _routed_moe_param_counts(config: ModelConfig) -> ParamCounts:
    moe = require_moe(config)
    hidden = config.hidden_size
    sparse_mlp = routed_experts_params(hidden, moe) + router_params(hidden, moe)
    dense_mlp = swiglu_mlp_params(hidden, config.intermediate_size)
    mlps = sum(sparse_mlp if kind == SPARSE else dense_mlp for kind in moe.mlp_layer_types)
    # The llama plan with a zero-width MLP counts exactly the embeddings, attention, norms, head.
    without_mlp = llama_param_counts(attrs.evolve(config, intermediate_size=0, mlp_bias=False))
    # No int8 path for these families yet (their records list no int8 linears).
    return attrs.evolve(
        without_mlp,
        layers=without_mlp.layers + mlps,
        layers_int8_weights=0,
        layers_int8_rows=0,
        layers_projection_shapes=(),
    )
