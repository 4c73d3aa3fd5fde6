"""Manifold-constrained hyper-connections (MHC): the residual of a token is ``N`` streams.

Before each mixer and each FFN a :class:`HyperConnection` reads the ``(tokens, N, hidden)``
streams, makes the sub-layer's input as a weighted sum of them (``pre``), and after the
sub-layer writes new streams: ``post[m] * y + sum_n comb[n, m] * X[n]``, where ``comb`` is a
doubly-stochastic ``N x N`` matrix (softmax, then Sinkhorn normalisation). Nothing mixes
tokens, and a token's weights do not depend on the rows beside it
(:mod:`~metrale_kernels.row_invariant`). All of it runs in float32 (float64 at a float64
serve); ``post`` and ``comb`` are cast to the streams' dtype before the mix.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_config import MhcConfig
from metrale_kernels import widened
from metrale_kernels.row_invariant import (
    matmul_call_rows,
    matmul_row_tile,
    pointwise_rows,
    row_invariant_linear,
)


class HyperConnection(nn.Module):
    def __init__(self, hidden_size: int, mhc: MhcConfig, rms_norm_eps: float) -> None:
        super().__init__()
        streams = mhc.num_streams
        self.num_streams = streams
        self.eps = mhc.eps
        self.rms_norm_eps = rms_norm_eps
        self.num_sinkhorn_iters = mhc.num_sinkhorn_iters
        # Rows: pre (N), post (N), comb (N * N, row-major [from stream][to stream]).
        self.fn = nn.Parameter(torch.empty((2 + streams) * streams, streams * hidden_size))
        self.base = nn.Parameter(torch.empty((2 + streams) * streams))
        self.scale = nn.Parameter(torch.empty(3))

    def read(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``streams (tokens, N, hidden)`` -> the sub-layer's input ``(tokens, hidden)`` and the
        ``post (tokens, N)`` and ``comb (tokens, N, N)`` weights :meth:`write` applies."""
        n = self.num_streams
        flat = widened(streams.flatten(1))
        flat = flat * torch.rsqrt(flat.pow(2).mean(dim=-1, keepdim=True) + self.rms_norm_eps)
        mixes = _row_invariant_mm(flat, self.fn.to(flat.dtype))
        base, scale = self.base.to(flat.dtype), self.scale.to(flat.dtype)
        pre = pointwise_rows(torch.sigmoid, scale[0] * mixes[:, :n] + base[:n]) + self.eps
        post = 2 * pointwise_rows(torch.sigmoid, scale[1] * mixes[:, n : 2 * n] + base[n : 2 * n])
        logits = scale[2] * mixes[:, 2 * n :] + base[2 * n :]
        comb = sinkhorn(logits.view(-1, n, n).softmax(dim=-1) + self.eps, self.eps,
                        self.num_sinkhorn_iters)  # fmt: skip
        layer_input = (pre.unsqueeze(-1) * widened(streams)).sum(dim=1).to(streams.dtype)
        return layer_input, post.to(streams.dtype), comb.to(streams.dtype)

    @staticmethod
    def write(
        streams: torch.Tensor, output: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        """New streams ``(tokens, N, hidden)``: ``post[m] * output + sum_n comb[n, m] * X[n]``."""
        mixed = torch.einsum("tnm,tnd->tmd", comb, streams)
        return mixed + post.unsqueeze(-1) * output.unsqueeze(1)


def _row_invariant_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T``, a token's row the same whatever rows share the call (on the CPU)."""
    if x.device.type != "cpu":
        return x @ weight.t()
    tile = matmul_row_tile(x.dtype)
    return row_invariant_linear(x, weight, None, tile, call_rows=matmul_call_rows(x.dtype))


def sinkhorn(matrix: torch.Tensor, eps: float, num_iters: int) -> torch.Tensor:
    """Column-normalise ``matrix (..., N, N)``, then ``num_iters - 1`` times row then column:
    it ends on a column step, so every column sums to (almost) one."""
    matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + eps)
    for _ in range(num_iters - 1):
        matrix = matrix / (matrix.sum(dim=-1, keepdim=True) + eps)
        matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + eps)
    return matrix
