"""How a config's RoPE table is laid out: rows of ``rotary_dim`` float32 values, one block of
``max_seq_len`` rows per table the model reads (from the config alone, for the model and the
memory plan alike): the main table, then the sliding layers' own (gemma3's local base)."""

from __future__ import annotations

from metrale_config import ModelConfig

LONGROPE = "longrope"


def rotary_dim(config: ModelConfig) -> int:
    """The leading dims of a head that rotary turns (transformers' ``int(head_dim * factor)``)."""
    if config.mla is not None:
        return config.mla.qk_rope_head_dim if config.mla.is_rotary else 0
    return int(config.head_dim * config.partial_rotary_factor)


def num_rope_tables(config: ModelConfig) -> int:
    return 1 if config.local_rope_theta is None else 2


def local_table_index(config: ModelConfig) -> int | None:
    """Which table sliding-window layers read when they have their own, else ``None``."""
    return None if config.local_rope_theta is None else 1
