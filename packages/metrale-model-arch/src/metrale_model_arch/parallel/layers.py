"""The layers of a split model that end in a collective (the default process group's).

Column-parallel projections need none: a rank's rows of q/k/v or gate/up are a plain
``nn.Linear`` of fewer rows. A row-parallel projection sums the ranks' partial products; the
vocabulary-parallel embedding sums the ranks' lookups (each rank answers for its own rows and
zeros elsewhere); the expert-parallel MoE block gathers the router's logits, runs the experts it
holds on the tokens routed to them and sums the ranks' outputs.

Quantized row-parallel projections give one process's result: each weight row's int8 scale is
the whole row's, an activation row is written in digits over the whole row, and int8's int32
partial sums add up exactly (q4's float block sums, like float weights', in another order).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from metrale_kernels import dequantize_rows
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.moe import SparseMoeBlock
from metrale_model_arch.families.q4_layers import Q4Linear


class ProcessGroupSplit:
    """The default process group's ranks as a :class:`metrale_kernels.ColumnSplit`."""

    def max_(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)

    def sum_(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)


RANKS = ProcessGroupSplit()


class RowParallelLinear(nn.Linear):
    """``x @ W.T`` over this rank's input columns, summed over ranks, then the (whole) bias.

    16-bit activations: the partial products are summed in float32 and rounded once, as one
    process's matmul accumulates and rounds (16-bit partials, each rounded before the sum,
    changed a tiny bf16 model's greedy tokens).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = float32_partial_product(x, self.weight)
        dist.all_reduce(out)
        out = out.to(x.dtype)
        return out if self.bias is None else out + self.bias


def float32_partial_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` accumulated and returned in float32, whatever ``x``'s dtype."""
    if x.dtype == torch.float32:
        return functional.linear(x, weight)
    rows = x.reshape(-1, x.shape[-1])
    if x.is_cuda:
        product = torch.mm(rows, weight.t(), out_dtype=torch.float32)
    else:
        # NOTE: no 16-bit matmul with a float32 result on the CPU: the weight is widened every
        # call, a cost of split 16-bit serves on the CPU only (not timed; float32 has none).
        product = rows.to(torch.float32) @ weight.to(torch.float32).t()
    return product.reshape(*x.shape[:-1], weight.shape[0])


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
    """:class:`RowParallelLinear` over int8 weights, one process's product bit for bit: a
    weight row's scale is the whole row's (a collective while the checkpoint loads, in the same
    order on every rank), the int32 partial sums add over the ranks."""

    def write_rows(self, index: tuple[int | slice, ...], values: torch.Tensor) -> None:
        self.quantize_into(index, values, split=RANKS)

    def forward(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.backend.int8_linear(
            x, self.qweight, self.scale, self.bias, out=out, split=RANKS
        )


class Q4RowParallelLinear(Q4Linear):
    """:class:`RowParallelLinear` over q4 blocks (a rank's columns, whole blocks of 32): the
    activation digits over the whole row, the float partial products summed, then the bias."""

    def forward(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.backend.q4_linear(x, self.packed, self.scales, self.bias, out=out, split=RANKS)


class Int8VocabParallelEmbedding(Int8Embedding):
    """:class:`VocabParallelEmbedding` over an int8 table (``start`` set by
    :func:`~metrale_model_arch.parallel.apply.apply_tensor_parallel_quantized`)."""

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
