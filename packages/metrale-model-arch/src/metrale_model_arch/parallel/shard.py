"""Which part of a model one rank holds: the split sizes, from the config alone."""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig

TENSOR_PARALLEL_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
FLAG = "--tensor-parallel-size"


class TensorParallelError(ValueError):
    """The model cannot be split ``world_size`` ways; the message names the flag."""


@attrs.frozen(kw_only=True)
class TensorShard:
    """Rank ``rank`` of ``world_size``: attention heads, the MLP's intermediate rows, the
    vocabulary and the routed experts are cut into ``world_size`` equal contiguous parts and
    this rank holds part ``rank``. KV heads are cut the same way, or, when there are fewer KV
    heads than ranks, each rank holds the one KV head its query heads read (replicated)."""

    rank: int
    world_size: int

    def __attrs_post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world size {self.world_size}")

    def part(self, size: int) -> slice:
        """This rank's contiguous part of ``size`` (a multiple of ``world_size``)."""
        step = size // self.world_size
        return slice(self.rank * step, (self.rank + 1) * step)

    def kv_heads(self, num_kv_heads: int) -> slice:
        if num_kv_heads >= self.world_size:
            return self.part(num_kv_heads)
        head = self.rank * num_kv_heads // self.world_size
        return slice(head, head + 1)


def shard_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """The config of one rank's model: every split size divided by ``world_size``.

    Raises :class:`TensorParallelError` naming ``--tensor-parallel-size`` when a size does
    not divide or the model type has no tensor-parallel path.
    """
    if world_size == 1:
        return config
    if config.model_type not in TENSOR_PARALLEL_MODEL_TYPES:
        raise TensorParallelError(
            f"{FLAG} {world_size}: {config.model_type} has no tensor-parallel path; "
            f"supported: {', '.join(TENSOR_PARALLEL_MODEL_TYPES)}"
        )
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
    }
    moe = config.moe
    if moe is not None:
        if moe.num_shared_experts:
            raise TensorParallelError(
                f"{FLAG} {world_size}: shared experts ({config.model_type}) are not split yet"
            )
        sizes["num_experts"] = moe.num_experts
    for name, size in sizes.items():
        if size % world_size:
            raise TensorParallelError(f"{FLAG} {world_size} does not divide {name} ({size})")
    kv = config.num_key_value_heads
    if kv % world_size and world_size % kv:
        raise TensorParallelError(
            f"{FLAG} {world_size}: num_key_value_heads ({kv}) neither divides by it nor divides it"
        )
    heads = config.num_attention_heads // world_size
    if moe is not None:
        moe = attrs.evolve(moe, num_experts=moe.num_experts // world_size)
    return attrs.evolve(
        config,
        num_attention_heads=heads,
        num_key_value_heads=max(kv // world_size, 1),
        intermediate_size=config.intermediate_size // world_size,
        vocab_size=config.vocab_size // world_size,
        moe=moe,
    )
