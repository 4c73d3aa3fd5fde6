"""Swap the collective-ending layers into a rank's model (built from its ``shard_config``)."""

from __future__ import annotations

from torch import nn

from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.llama import LlamaAttention, LlamaMLP
from metrale_model_arch.families.moe import SparseMoeBlock
from metrale_model_arch.families.q4_layers import Q4Linear
from metrale_model_arch.parallel.layers import (
    ExpertParallelMoeBlock,
    Int8RowParallelLinear,
    Int8VocabParallelEmbedding,
    Q4RowParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from metrale_model_arch.parallel.shard import TensorShard

ROW_PARALLEL = ("o_proj", "down_proj")


def apply_tensor_parallel(model: CausalLM, shard: TensorShard) -> None:
    """In place, before weights load (on the meta device): o_proj and down_proj become
    :class:`RowParallelLinear`, the embeddings :class:`VocabParallelEmbedding` (a tied head
    follows them), sparse MoE blocks :class:`ExpertParallelMoeBlock`."""
    for module in list(model.modules()):
        if isinstance(module, LlamaAttention):
            module.o_proj = _row_parallel(module.o_proj)
        elif isinstance(module, LlamaMLP):
            module.down_proj = _row_parallel(module.down_proj)
        elif isinstance(module, SparseMoeBlock):
            # Same parameters and names; only the forward changes.
            module.__class__ = ExpertParallelMoeBlock
            assert isinstance(module, ExpertParallelMoeBlock)
            module.expert_start = shard.rank * module.experts.gate_up_proj.shape[0]
            module.world_size = shard.world_size
    inner = model.get_submodule("model")
    old = inner.embed_tokens
    assert isinstance(old, nn.Embedding)
    head = getattr(model, "lm_head", None)
    tied = isinstance(head, nn.Linear) and head.weight is old.weight
    inner.embed_tokens = VocabParallelEmbedding(
        old.num_embeddings, old.embedding_dim, start=shard.rank * old.num_embeddings
    )
    if tied:
        assert isinstance(head, nn.Linear)
        head.weight = inner.embed_tokens.weight


def apply_tensor_parallel_quantized(model: CausalLM, shard: TensorShard) -> None:
    """After :func:`apply_tensor_parallel` and the int8 or q4 swap (which replaced the
    row-parallel projections and the embeddings with plain quantized stand-ins): give them back
    their collective. Same buffers and names; only the loading and the forward change."""
    for name, module in model.named_modules():
        row_parallel = name.rpartition(".")[2] in ROW_PARALLEL
        if isinstance(module, Int8Linear) and row_parallel:
            module.__class__ = Int8RowParallelLinear
        elif isinstance(module, Q4Linear) and row_parallel:
            module.__class__ = Q4RowParallelLinear
        elif isinstance(module, Int8Embedding):
            module.__class__ = Int8VocabParallelEmbedding
            assert isinstance(module, Int8VocabParallelEmbedding)
            module.start = shard.rank * module.logical_shape[0]


def _row_parallel(linear: nn.Module) -> RowParallelLinear:
    assert isinstance(linear, nn.Linear)
    return RowParallelLinear(linear.in_features, linear.out_features, bias=linear.bias is not None)
