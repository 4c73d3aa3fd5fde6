"""Memory math: pure functions of a config and the serve arguments (no weights, no device)."""

from metrale_model_arch.glm5_next_skeleton import (
    GLM5_NEXT_MODEL_TYPES,
    Ffn,
    Glm5NextTextSkeleton,
    Mixer,
)
from metrale_model_arch.memory.arena import ArenaBuffer, arena_buffers, buffer_arena_bytes
from metrale_model_arch.memory.draft import (
    DraftInputs,
    draft_kv_bytes_per_token,
    draft_max_seq_len,
    draft_model_bytes,
    mtp_cache_spec,
    mtp_kv_bytes_per_token,
)
from metrale_model_arch.memory.dsa_state import (
    dsa_capacity,
    indexer_state_bytes,
    paged_indexer_bytes_per_token,
)
from metrale_model_arch.memory.encoder import (
    ENCODER_CACHE_PAGE_TOKENS,
    EncoderInputs,
    encoder_activation_bytes,
    encoder_cache_bytes,
    encoder_cache_pages,
)
from metrale_model_arch.memory.headroom import runtime_headroom_bytes, step_activation_bytes
from metrale_model_arch.memory.kv_price import kv_bytes_per_block, kv_bytes_per_token
from metrale_model_arch.memory.linear_state import (
    linear_state_bytes_per_slot,
    linear_state_pool_bytes,
)
from metrale_model_arch.memory.plan import (
    BUFFER_ARENA,
    DRAFT_KV_POOL,
    DRAFT_MODEL,
    ENCODER_ACTIVATIONS,
    ENCODER_CACHE,
    KV_POOL,
    LINEAR_STATE_POOL,
    PER_SEQUENCE_STATE,
    ROPE_TABLE,
    RUNTIME_HEADROOM,
    SLIDING_WINDOW_KV,
    MemoryPlan,
    MemoryPlanError,
    PlanInputs,
    plan_memory,
)
from metrale_model_arch.memory.rope_table import rope_table_bytes
from metrale_model_arch.memory.seq_state_reserve import (
    PerSequenceState,
    ProposerBuffer,
    drafts_with_dsa,
    per_sequence_state_bytes,
    proposer_buffers,
)
from metrale_model_arch.memory.sliding_window_kv import (
    sliding_window_kv_bytes,
    sliding_window_kv_bytes_per_slot,
)
from metrale_model_arch.memory.weights import (
    MTP,
    VISION,
    WEIGHT_OWNERS,
    ParamCounts,
    WeightBytes,
    param_counts,
    weight_bytes,
    weight_owner,
)

__all__ = [
    "BUFFER_ARENA",
    "DRAFT_KV_POOL",
    "DRAFT_MODEL",
    "ENCODER_ACTIVATIONS",
    "ENCODER_CACHE",
    "ENCODER_CACHE_PAGE_TOKENS",
    "GLM5_NEXT_MODEL_TYPES",
    "KV_POOL",
    "LINEAR_STATE_POOL",
    "MTP",
    "PER_SEQUENCE_STATE",
    "ROPE_TABLE",
    "RUNTIME_HEADROOM",
    "SLIDING_WINDOW_KV",
    "VISION",
    "WEIGHT_OWNERS",
    "ArenaBuffer",
    "DraftInputs",
    "EncoderInputs",
    "Ffn",
    "Glm5NextTextSkeleton",
    "MemoryPlan",
    "MemoryPlanError",
    "Mixer",
    "ParamCounts",
    "PerSequenceState",
    "PlanInputs",
    "ProposerBuffer",
    "WeightBytes",
    "arena_buffers",
    "buffer_arena_bytes",
    "draft_kv_bytes_per_token",
    "draft_max_seq_len",
    "draft_model_bytes",
    "drafts_with_dsa",
    "dsa_capacity",
    "encoder_activation_bytes",
    "encoder_cache_bytes",
    "encoder_cache_pages",
    "indexer_state_bytes",
    "kv_bytes_per_block",
    "kv_bytes_per_token",
    "linear_state_bytes_per_slot",
    "linear_state_pool_bytes",
    "mtp_cache_spec",
    "mtp_kv_bytes_per_token",
    "paged_indexer_bytes_per_token",
    "param_counts",
    "per_sequence_state_bytes",
    "plan_memory",
    "proposer_buffers",
    "rope_table_bytes",
    "runtime_headroom_bytes",
    "sliding_window_kv_bytes",
    "sliding_window_kv_bytes_per_slot",
    "step_activation_bytes",
    "weight_bytes",
    "weight_owner",
]
