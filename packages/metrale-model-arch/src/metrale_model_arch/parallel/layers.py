"""The layers of a split model that end in a collective (the default process group's).

Column-parallel projections need none: a rank's rows of q/k/v or gate/up are a plain
``nn.Linear`` of fewer rows. A row-parallel projection sums the ranks' partial products; the
vocabulary-parallel embedding sums the ranks' lookups (each rank answers for its own rows and
zeros elsewhere); the expert-parallel MoE block gathers the router's logits, runs the experts it
holds on the tokens routed to them and sums the ranks' outputs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from metrale_kernels import dequantize_rows
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.moe import SparseMoeBlock


class RowParallelLinear(nn.Linear):
    """``x @ W.T`` over this rank's input columns, summed over ranks, then the (whole) bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = functional.linear(x, self.weight)
        dist.all_reduce(out)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``[start, start + num_embeddings)`` of the vocabulary's embedding table."""

    def __init__(self, num_embeddings: int, embedding_dim: int, start: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.start = start

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        rows = self.weight[local.masked_fill(outside, 0)]
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        dist.all_reduce(rows)
        return rows


class Int8RowParallelLinear(Int8Linear):
    """:class:`RowParallelLinear` over int8 weights: each rank's per-row scales are those of
    its own columns."""

    def forward(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        partial = self.backend.int8_linear(x, self.qweight, self.scale, None, out=out)
        dist.all_reduce(partial)
        return partial if self.bias is None else partial + self.bias


class Int8VocabParallelEmbedding(Int8Embedding):
    """:class:`VocabParallelEmbedding` over an int8 table (``start`` set by
    :func:`~metrale_model_arch.parallel.apply.apply_tensor_parallel_int8`)."""

    start: int

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.logical_shape[0])
        inside = local.masked_fill(outside, 0)
        rows = dequantize_rows(self.qweight[inside], self.scale[inside])
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        dist.all_reduce(rows)
        return rows


class ExpertParallelMoeBlock(SparseMoeBlock):
    """A :class:`SparseMoeBlock` holding experts ``[expert_start, expert_start + local)``.

    Set on a built block by :func:`~metrale_model_arch.parallel.apply.apply_tensor_parallel`
    (``expert_start``, ``world_size``); its router holds the same experts' rows.
    """

    expert_start: int
    world_size: int

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        router_logits = all_gather_last_dim(self.gate(hidden), self.world_size)
        # (tokens, top_k) over all experts; weights of experts held elsewhere are zeroed.
        topk_weights, topk_ids = self.backend.softmax_topk_routing(
            router_logits, self.top_k, self.renormalize
        )
        num_local = self.experts.gate_up_proj.shape[0]
        local_ids = topk_ids - self.expert_start
        elsewhere = (local_ids < 0) | (local_ids >= num_local)
        out = self.backend.fused_moe(
            hidden,
            self.experts.gate_up_proj,
            self.experts.down_proj,
            topk_weights.masked_fill(elsewhere, 0.0),
            local_ids.masked_fill(elsewhere, 0),
        )
        dist.all_reduce(out)
        if self.routed_scaling_factor != 1.0:
            out = out * self.routed_scaling_factor
        return out


def all_gather_last_dim(local: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's ``(..., n)`` part, concatenated in rank order: ``(..., world_size * n)``."""
    local = local.contiguous()
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts, dim=-1)


def gather_vocab_logits(local_logits: torch.Tensor, world_size: int) -> torch.Tensor:
    """The whole vocabulary's logits from each rank's ``(n, vocab / world_size)`` part."""
    return all_gather_last_dim(local_logits, world_size)
