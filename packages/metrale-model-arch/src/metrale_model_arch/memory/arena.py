"""The buffer arena: step buffers allocated once at start, sized by the batch limits.

The model runner stages every step's token ids, positions and KV slots (int64, up to
``max_batch_tokens``), keeps every running sequence's block table in one persistent row of
``block_tables`` (``max_batch_size`` rows of ``ceil(max_seq_len / block_size)`` int64 block
ids, updated only when a sequence gains a block), and writes the sampled rows' logits (up to
``max_batch_size`` rows of ``vocab_size`` at the model dtype) into these buffers instead of
allocating them each step.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig

INT64_BYTES = 8


@attrs.frozen(kw_only=True)
class ArenaBuffer:
    name: str
    shape: tuple[int, ...]
    # "int64" or "model": the model's dtype.
    dtype: str
    num_bytes: int


def arena_buffers(
    config: ModelConfig,
    *,
    max_batch_tokens: int,
    max_batch_size: int,
    dtype_bytes: int,
    max_seq_len: int,
    block_size: int,
) -> tuple[ArenaBuffer, ...]:
    """Every arena buffer, in allocation order."""
    logits_shape = (max(max_batch_size, 1), config.vocab_size)
    table_shape = (max(max_batch_size, 1), -(-max_seq_len // block_size))
    return (
        ArenaBuffer(
            name="input_ids",
            shape=(max_batch_tokens,),
            dtype="int64",
            num_bytes=max_batch_tokens * INT64_BYTES,
        ),
        ArenaBuffer(
            name="positions",
            shape=(max_batch_tokens,),
            dtype="int64",
            num_bytes=max_batch_tokens * INT64_BYTES,
        ),
        ArenaBuffer(
            name="slot_mapping",
            shape=(max_batch_tokens,),
            dtype="int64",
            num_bytes=max_batch_tokens * INT64_BYTES,
        ),
        ArenaBuffer(
            name="block_tables",
            shape=table_shape,
            dtype="int64",
            num_bytes=table_shape[0] * table_shape[1] * INT64_BYTES,
        ),
        ArenaBuffer(
            name="logits",
            shape=logits_shape,
            dtype="model",
            num_bytes=logits_shape[0] * logits_shape[1] * dtype_bytes,
        ),
    )


def buffer_arena_bytes(
    config: ModelConfig,
    *,
    max_batch_tokens: int,
    max_batch_size: int,
    dtype_bytes: int,
    max_seq_len: int,
    block_size: int,
) -> int:
    return sum(
        buffer.num_bytes
        for buffer in arena_buffers(
            config,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            dtype_bytes=dtype_bytes,
            max_seq_len=max_seq_len,
            block_size=block_size,
        )
    )
