"""The owners every byte of device memory is charged to, shared by the plan and the allocators."""

from __future__ import annotations

EMBEDDINGS = "weights.embeddings"
LAYERS = "weights.layers"
FINAL_NORM = "weights.final_norm"
LM_HEAD = "weights.lm_head"
WEIGHT_OWNERS = (EMBEDDINGS, LAYERS, FINAL_NORM, LM_HEAD)
# Multi-token-prediction layers loaded beside the stack for speculation (glm4_moe): an owner
# only for the model types that load them.
MTP = "weights.mtp"
MTP_PARAM_PREFIX = "model.mtp_layers."
# A vision tower loaded beside the text stack (glm5_next): an owner only where one is loaded.
VISION = "weights.vision"
VISION_PARAM_PREFIX = "model.visual."

ROPE_TABLE = "rope_table"
ROPE_TABLE_BUFFER = "cos_sin_cache"  # the module buffer that holds it
KV_POOL = "kv_pool"
BUFFER_ARENA = "buffer_arena"
PER_SEQUENCE_STATE = "per_sequence_state"
LINEAR_STATE_POOL = "linear_state_pool"
# Sliding-window layers' K/V held per sequence, a ring of the window and one step's tokens.
SLIDING_WINDOW_KV = "sliding_window_kv"
RUNTIME_HEADROOM = "runtime_headroom"
# Images: the encoder's output cache (allocated once) and one encoder batch's activations
# (transient, as the runtime headroom).
ENCODER_CACHE = "encoder_cache"
ENCODER_ACTIVATIONS = "encoder_activations"
# A speculative draft model: its weights and RoPE table, and its own KV pool.
DRAFT_MODEL = "draft_model"
DRAFT_KV_POOL = "draft_kv_pool"
# Speculation over per-sequence state: each slot's checkpoint before a verify step, and the
# MTP proposer's own per-sequence state (its drafter layer's indexer and fixed buffers).
SPEC_STATE_SNAPSHOT = "spec_state_snapshot"
PROPOSER_STATE = "proposer_state"


def weight_owner(param_name: str) -> str:
    """The owner of a parameter by its Hugging Face name (``model.layers.3.mlp...`` -> layers)."""
    if param_name.startswith("lm_head."):
        return LM_HEAD
    if param_name.startswith("model.embed_tokens."):
        return EMBEDDINGS
    if param_name.startswith("model.norm."):
        return FINAL_NORM
    if param_name.startswith(MTP_PARAM_PREFIX):
        return MTP
    if param_name.startswith(VISION_PARAM_PREFIX):
        return VISION
    return LAYERS
