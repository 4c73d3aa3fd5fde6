"""Runtime headroom: memory a running server needs that no allocation at start holds.

Three parts. A fixed runtime floor (on the CPU: the interpreter, torch, the tokenizer and the
HTTP stack; on CUDA also the driver's context, modules and graphs, as the Rust engine calibrates
it: 1 GiB plus 2.1% of the budget). The activations of the widest step: ``max_batch_tokens``
tokens through one layer's projections and MLP. And the torch attention's scores: prefill
attends one sequence at a time, materialising float32 scores and a mask of at most
``min(max_batch_tokens, max_seq_len)`` queries over ``max_seq_len`` keys, per head.
"""

from __future__ import annotations

from metrale_config import ModelConfig

MIB = 2**20
CPU_RUNTIME_FIXED_BYTES = 512 * MIB
CUDA_DRIVER_FIXED_BYTES = 1024 * MIB
CUDA_DRIVER_BUDGET_PER_MILLE = 21
FLOAT32_BYTES = 4
# Per score: the float32 score, its softmax output and a one-byte mask.
SCORE_BYTES = 2 * FLOAT32_BYTES + 1


def step_activation_bytes(
    config: ModelConfig, *, max_batch_tokens: int, max_seq_len: int, dtype_bytes: int
) -> int:
    """The largest step's live activations and attention scratch."""
    hidden = config.hidden_size
    q_size = config.num_attention_heads * config.head_dim
    kv_size = 2 * config.num_key_value_heads * config.head_dim
    intermediate = config.intermediate_size
    if config.moe is not None:
        routed = config.moe.moe_intermediate_size * config.moe.num_experts_per_tok
        intermediate = max(intermediate, routed)
    per_token = 4 * hidden + q_size + kv_size + 3 * intermediate
    num_queries = min(max_batch_tokens, max_seq_len)
    scores = config.num_attention_heads * num_queries * max_seq_len * SCORE_BYTES
    context = 2 * max_seq_len * kv_size * dtype_bytes
    return max_batch_tokens * per_token * dtype_bytes + scores + context


def runtime_headroom_bytes(
    config: ModelConfig,
    *,
    device_kind: str,
    budget_bytes: int,
    max_batch_tokens: int,
    max_seq_len: int,
    dtype_bytes: int,
) -> int:
    """The headroom term for a ``device_kind`` ("cpu" or "cuda") serve."""
    fixed = CPU_RUNTIME_FIXED_BYTES
    if device_kind == "cuda":
        fixed += CUDA_DRIVER_FIXED_BYTES + budget_bytes * CUDA_DRIVER_BUDGET_PER_MILLE // 1000
    return fixed + step_activation_bytes(
        config,
        max_batch_tokens=max_batch_tokens,
        max_seq_len=max_seq_len,
        dtype_bytes=dtype_bytes,
    )
