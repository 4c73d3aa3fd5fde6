"""The llama family's parameters (llama, mistral, qwen2, qwen3)."""

from __future__ import annotations

from metrale_config import ModelConfig
from metrale_model_arch.counts.base import ParamCounts


def llama_param_counts(config: ModelConfig) -> ParamCounts:
    """Exactly as ``LlamaForCausalLM`` builds it."""
    hidden = config.hidden_size
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    attention = hidden * (q_size + 2 * kv_size) + q_size * hidden
    linear_weights = attention + 3 * hidden * config.intermediate_size
    linear_rows = (q_size + 2 * kv_size) + hidden + 2 * config.intermediate_size + hidden
    projections = (
        (q_size + 2 * kv_size, hidden),
        (hidden, q_size),
        (2 * config.intermediate_size, hidden),
        (hidden, config.intermediate_size),
    )
    if config.qkv_bias:
        attention += q_size + 2 * kv_size
    if config.o_proj_bias:
        attention += hidden
    if config.qk_norm:
        attention += 2 * config.head_dim
    mlp = 3 * hidden * config.intermediate_size
    if config.mlp_bias:
        mlp += 2 * config.intermediate_size + hidden
    per_layer = attention + mlp + 2 * hidden
    embeddings = config.vocab_size * hidden
    return ParamCounts(
        embeddings=embeddings,
        layers=config.num_hidden_layers * per_layer,
        final_norm=hidden,
        lm_head=0 if config.tie_word_embeddings else embeddings,
        layers_int8_weights=config.num_hidden_layers * linear_weights,
        layers_int8_rows=config.num_hidden_layers * linear_rows,
        layers_projection_shapes=projections * config.num_hidden_layers,
    )
