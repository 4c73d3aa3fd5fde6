"""Narrow a checkpoint's tensors (Hugging Face names) to the shard one rank holds.

Column-parallel tensors (q/k/v, gate/up, the vocabulary's rows, the router's experts) keep
the rank's rows; row-parallel ones (o_proj, down_proj) the rank's columns, their bias whole
(added once, after the reduction); routed experts outside the rank's part are dropped and the
others renumbered from 0. Everything else (norms, q/k norms) is replicated. A loader that can
read part of a tensor (safetensors) asks :class:`CheckpointSharder` which part, and reads only
that.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import attrs
import torch

from metrale_config import ModelConfig
from metrale_model_arch.parallel.shard import TensorShard
from metrale_model_arch.q4_1_blocks import Q4_1Blocks

_ATTENTION = re.compile(r".+\.self_attn\.(?P<proj>[qkvo])_proj\.(?P<kind>weight|bias)")
_DENSE_MLP = re.compile(r".+\.mlp\.(?P<proj>gate|up|down)_proj\.(?P<kind>weight|bias)")
_VOCAB = re.compile(r"(model\.embed_tokens|lm_head)\.weight")
_ROUTER = re.compile(r".+\.(mlp|block_sparse_moe)\.gate\.weight")
_EXPERT = re.compile(
    r"(?P<prefix>.+\.(?:mlp|block_sparse_moe)\.experts\.)(?P<expert>\d+)(?P<rest>\..+)"
)
_STACKED_EXPERTS = re.compile(
    r".+\.mlp\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)(\.weight)?"
)


@attrs.frozen
class ShardSlice:
    """This rank's part of one checkpoint tensor: ``tensor[index]``, loaded under ``name``."""

    name: str
    index: tuple[slice, ...] = ()


class CheckpointSharder:
    """Which part of each checkpoint tensor (Hugging Face names) rank ``shard`` holds."""

    def __init__(self, config: ModelConfig, shard: TensorShard) -> None:
        head_dim = config.head_dim
        heads = shard.part(config.num_attention_heads)
        kv_heads = shard.kv_heads(config.num_key_value_heads)
        self.q_rows = slice(heads.start * head_dim, heads.stop * head_dim)
        self.kv_rows = slice(kv_heads.start * head_dim, kv_heads.stop * head_dim)
        self.inter = shard.part(config.intermediate_size)
        self.vocab = shard.part(config.vocab_size)
        self.experts = shard.part(config.moe.num_experts) if config.moe else slice(0, 0)

    def slice_of(self, name: str) -> ShardSlice | None:
        """``None``: the tensor is none of this rank's (a routed expert held elsewhere)."""
        every_row = slice(None)
        if match := _ATTENTION.fullmatch(name):
            proj, kind = match["proj"], match["kind"]
            if proj == "o":
                return ShardSlice(name, () if kind == "bias" else (every_row, self.q_rows))
            return ShardSlice(name, (self.q_rows if proj == "q" else self.kv_rows,))
        if match := _DENSE_MLP.fullmatch(name):
            if match["proj"] != "down":
                return ShardSlice(name, (self.inter,))
            return ShardSlice(name, () if match["kind"] == "bias" else (every_row, self.inter))
        if _VOCAB.fullmatch(name):
            return ShardSlice(name, (self.vocab,))
        if _ROUTER.fullmatch(name) or _STACKED_EXPERTS.fullmatch(name):
            return ShardSlice(name, (self.experts,))
        if match := _EXPERT.fullmatch(name):
            expert = int(match["expert"])
            if not self.experts.start <= expert < self.experts.stop:
                return None
            return ShardSlice(f"{match['prefix']}{expert - self.experts.start}{match['rest']}")
        return ShardSlice(name)


def shard_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor | Q4_1Blocks]],
    config: ModelConfig,
    shard: TensorShard,
) -> Iterator[tuple[str, torch.Tensor | Q4_1Blocks]]:
    """``weights`` of the whole model (``config`` is the unsplit one) -> this rank's part (a
    GGUF's Q4_1 blocks stay blocks where the part starts and ends on them)."""
    sharder = CheckpointSharder(config, shard)
    for name, tensor in weights:
        part = sharder.slice_of(name)
        if part is not None:
            yield part.name, tensor[part.index] if part.index else tensor
