"""The dense variants' parameters (olmo2, granite, smollm3, phi3, gemma2, gemma3_text).

The llama family's count, plus the norms a layer's ``norm_layout`` adds (gemma's four) and q/k
norms over the whole projection (olmo2) rather than one head.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig, NormLayout
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.counts.llama import llama_param_counts

_NORMS_PER_LAYER = {NormLayout.PRE: 2, NormLayout.POST: 2, NormLayout.SANDWICH: 4}


def dense_variant_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``DenseVariantForCausalLM`` builds it (no int8 path: none of the int8 fields)."""
    plain = llama_param_counts(attrs.evolve(config, qk_norm=False))
    hidden = config.hidden_size
    extra = (_NORMS_PER_LAYER[config.norm_layout] - 2) * hidden
    if config.qk_norm:
        if config.qk_norm_per_head:
            extra += 2 * config.head_dim
        else:
            extra += (config.num_attention_heads + config.num_key_value_heads) * config.head_dim
    return attrs.evolve(
        plain,
        layers=plain.layers + config.num_hidden_layers * extra,
        layers_int8_weights=0,
        layers_int8_rows=0,
        layers_projection_shapes=(),
    )
