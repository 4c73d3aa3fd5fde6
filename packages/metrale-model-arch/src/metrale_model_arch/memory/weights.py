"""Weight bytes by owner, from the config alone.

Owners are the parts of the model a reader asks about: the token embeddings, the decoder
layers, the final norm and the LM head. A head tied to the embeddings is counted once, under
``embeddings``. Quantized checkpoints are dequantized at load, so every weight costs its
parameter count times the serve dtype's size, except parameters the architecture keeps in
float32 (counted apart, in ``ParamCounts.*_fp32``).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.memory.weights_glm5_next import glm5_next_param_counts
from metrale_model_arch.memory.weights_moe import mixtral_param_counts, qwen3_moe_param_counts

FLOAT32_BYTES = 4

EMBEDDINGS = "weights.embeddings"
LAYERS = "weights.layers"
FINAL_NORM = "weights.final_norm"
LM_HEAD = "weights.lm_head"
WEIGHT_OWNERS = (EMBEDDINGS, LAYERS, FINAL_NORM, LM_HEAD)


@attrs.frozen(kw_only=True)
class ParamCounts:
    """Parameter counts by owner at the serve dtype, plus the layers' float32 parameters."""

    embeddings: int
    layers: int
    final_norm: int
    lm_head: int
    layers_fp32: int = 0


@attrs.frozen(kw_only=True)
class WeightBytes:
    embeddings: int
    layers: int
    final_norm: int
    lm_head: int

    def total(self) -> int:
        return self.embeddings + self.layers + self.final_norm + self.lm_head

    def by_owner(self) -> dict[str, int]:
        return {
            EMBEDDINGS: self.embeddings,
            LAYERS: self.layers,
            FINAL_NORM: self.final_norm,
            LM_HEAD: self.lm_head,
        }


def weight_owner(param_name: str) -> str:
    """The owner of a parameter by its Hugging Face name (``model.layers.3.mlp...`` -> layers)."""
    if param_name.startswith("lm_head."):
        return LM_HEAD
    if param_name.startswith("model.embed_tokens."):
        return EMBEDDINGS
    if param_name.startswith("model.norm."):
        return FINAL_NORM
    return LAYERS


def llama_param_counts(config: ModelConfig) -> ParamCounts:
    """The llama family (llama, mistral, qwen2, qwen3) exactly as ``LlamaForCausalLM`` builds it."""
    hidden = config.hidden_size
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    attention = hidden * (q_size + 2 * kv_size) + q_size * hidden
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
    )


PARAM_COUNTERS: dict[str, Callable[[ModelConfig], ParamCounts]] = {
    "llama": llama_param_counts,
    "mistral": llama_param_counts,
    "qwen2": llama_param_counts,
    "qwen3": llama_param_counts,
    "qwen3_moe": qwen3_moe_param_counts,
    "mixtral": mixtral_param_counts,
    "glm5_next": glm5_next_param_counts,
    "glm5_next_text": glm5_next_param_counts,
}


def param_counts(config: ModelConfig) -> ParamCounts:
    counter = PARAM_COUNTERS.get(config.model_type)
    if counter is None:
        raise ValueError(
            f"{config.source}: no weight plan for model_type {config.model_type!r} "
            f"(planned: {', '.join(sorted(PARAM_COUNTERS))})"
        )
    return counter(config)


def weight_bytes(config: ModelConfig, dtype_bytes: int) -> WeightBytes:
    """Bytes of every weight at ``dtype_bytes`` per element (float32 parameters stay 4)."""
    counts = param_counts(config)
    return WeightBytes(
        embeddings=counts.embeddings * dtype_bytes,
        layers=counts.layers * dtype_bytes + counts.layers_fp32 * FLOAT32_BYTES,
        final_norm=counts.final_norm * dtype_bytes,
        lm_head=counts.lm_head * dtype_bytes,
    )
