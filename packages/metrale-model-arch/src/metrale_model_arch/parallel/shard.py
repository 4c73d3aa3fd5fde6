"""Which part of a model one rank holds: the split sizes, from the config alone."""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig

# The model types that run split across ranks.
TENSOR_PARALLEL_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
# ... and those whose per-rank memory can be planned (``met memory``) but that do not run split.
PLANNED_ONLY_MODEL_TYPES = ("glm5_next",)
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

    Split: attention heads, KV heads (at least one a rank), the dense MLP's rows, the
    vocabulary, the routed experts, the shared experts' rows and linear attention's heads.
    Replicated: norms, MLA's latent cache (every rank attends over all of it) and the DSA
    indexer. Raises :class:`TensorParallelError` naming ``--tensor-parallel-size`` when a
    size does not divide or the model type cannot even be planned split.
    """
    if world_size == 1:
        return config
    if config.model_type not in (*TENSOR_PARALLEL_MODEL_TYPES, *PLANNED_ONLY_MODEL_TYPES):
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
    shared_size = None
    if moe is not None:
        sizes["num_experts"] = moe.num_experts
        if moe.num_shared_experts:
            shared_size = moe.shared_expert_intermediate_size or (
                moe.num_shared_experts * moe.moe_intermediate_size
            )
            sizes["the shared experts' intermediate size"] = shared_size
    linear = config.linear_attention
    if linear is not None:
        sizes["linear attention heads"] = linear.num_heads
    for name, size in sizes.items():
        if size % world_size:
            raise TensorParallelError(f"{FLAG} {world_size} does not divide {name} ({size})")
    kv = config.num_key_value_heads
    if kv % world_size and world_size % kv:
        raise TensorParallelError(
            f"{FLAG} {world_size}: num_key_value_heads ({kv}) neither divides by it nor divides it"
        )
    if moe is not None:
        moe = attrs.evolve(
            moe,
            num_experts=moe.num_experts // world_size,
            shared_expert_intermediate_size=(
                None if shared_size is None else shared_size // world_size
            ),
        )
    if linear is not None:
        linear = attrs.evolve(
            linear,
            num_heads=linear.num_heads // world_size,
            num_key_heads=linear.num_key_heads // world_size,
        )
    return attrs.evolve(
        config,
        num_attention_heads=config.num_attention_heads // world_size,
        num_key_value_heads=max(kv // world_size, 1),
        intermediate_size=config.intermediate_size // world_size,
        vocab_size=config.vocab_size // world_size,
        moe=moe,
        linear_attention=linear,
    )


def check_runs_split(config: ModelConfig, world_size: int) -> None:
    """Raise :class:`TensorParallelError` unless ``config`` can run on ``world_size`` ranks."""
    if world_size == 1:
        return
    if config.model_type not in TENSOR_PARALLEL_MODEL_TYPES:
        raise TensorParallelError(
            f"{FLAG} {world_size}: {config.model_type} does not run split yet (`met memory` "
            f"plans it); it runs on: {', '.join(TENSOR_PARALLEL_MODEL_TYPES)}"
        )
    if config.moe is not None and config.moe.num_shared_experts:
        raise TensorParallelError(
            f"{FLAG} {world_size}: shared experts ({config.model_type}) are not split yet"
        )
    shard_config(config, world_size)
