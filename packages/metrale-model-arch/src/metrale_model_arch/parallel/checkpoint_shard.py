"""Narrow a checkpoint's tensors (Hugging Face names) to the shard one rank holds.

Column-parallel tensors (q/k/v, gate/up, the vocabulary's rows, the router's experts) keep
the rank's rows; row-parallel ones (o_proj, down_proj) the rank's columns, their bias whole
(added once, after the reduction); routed experts outside the rank's part are dropped and the
others renumbered from 0. Everything else (norms, q/k norms) is replicated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from metrale_config import ModelConfig
from metrale_model_arch.parallel.shard import TensorShard

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


def shard_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor]], config: ModelConfig, shard: TensorShard
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` of the whole model (``config`` is the unsplit one) -> this rank's part."""
    head_dim = config.head_dim
    heads = shard.part(config.num_attention_heads)
    kv_heads = shard.kv_heads(config.num_key_value_heads)
    q_rows = slice(heads.start * head_dim, heads.stop * head_dim)
    kv_rows = slice(kv_heads.start * head_dim, kv_heads.stop * head_dim)
    inter = shard.part(config.intermediate_size)
    vocab = shard.part(config.vocab_size)
    experts = shard.part(config.moe.num_experts) if config.moe is not None else slice(0, 0)
    for name, tensor in weights:
        if match := _ATTENTION.fullmatch(name):
            proj, kind = match["proj"], match["kind"]
            if proj == "o":
                yield name, tensor if kind == "bias" else tensor[:, q_rows]
            else:
                yield name, tensor[q_rows if proj == "q" else kv_rows]
        elif match := _DENSE_MLP.fullmatch(name):
            if match["proj"] != "down":
                yield name, tensor[inter]
            else:
                yield name, tensor if match["kind"] == "bias" else tensor[:, inter]
        elif _VOCAB.fullmatch(name):
            yield name, tensor[vocab]
        elif _ROUTER.fullmatch(name) or _STACKED_EXPERTS.fullmatch(name):
            yield name, tensor[experts]
        elif match := _EXPERT.fullmatch(name):
            expert = int(match["expert"])
            if experts.start <= expert < experts.stop:
                yield f"{match['prefix']}{expert - experts.start}{match['rest']}", tensor
        else:
            yield name, tensor
