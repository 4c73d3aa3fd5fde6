"""The linear-attention (KDA) state pool: recurrent and conv state per slot.

Each linear-attention layer keeps, per sequence slot, a float32 recurrent state of ``num_heads
x head_dim x head_dim`` and the last ``conv_kernel_dim - 1`` inputs of its short convolution
over q, k and v (``3 * num_heads * head_dim`` channels, float32 like the conv weights). The pool
holds one more slot than ``max_batch_size``: a dummy slot that padded rows write to.
"""

from __future__ import annotations

from metrale_config import LINEAR_ATTENTION, ModelConfig

FLOAT32_BYTES = 4
DUMMY_SLOTS = 1


def linear_state_bytes_per_slot(config: ModelConfig) -> int:
    """One sequence's linear-attention state over every linear-attention layer."""
    linear = config.linear_attention
    num_layers = config.num_layers_of_type(LINEAR_ATTENTION)
    if linear is None or num_layers == 0:
        return 0
    qkv_dim = linear.num_heads * linear.head_dim
    recurrent = linear.num_heads * linear.head_dim * linear.head_dim * FLOAT32_BYTES
    conv = 3 * qkv_dim * (linear.conv_kernel_dim - 1) * FLOAT32_BYTES
    return num_layers * (recurrent + conv)


def linear_state_pool_bytes(config: ModelConfig, max_batch_size: int) -> int:
    """The pool for ``max_batch_size`` slots (0 counts as 1) plus the dummy slot."""
    per_slot = linear_state_bytes_per_slot(config)
    if per_slot == 0:
        return 0
    return (max(max_batch_size, 1) + DUMMY_SLOTS) * per_slot
