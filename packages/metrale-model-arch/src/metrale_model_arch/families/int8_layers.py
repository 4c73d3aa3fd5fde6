"""Int8 stand-ins for ``nn.Linear`` and ``nn.Embedding`` (:mod:`metrale_model_arch.weight_format`).

Each holds ``qweight (out, in)`` int8 and ``scale (out,)`` float32 as buffers, filled a block of
output rows at a time while the checkpoint streams in (a fused q/k/v projection gets its q, k
and v rows from three tensors; each row's scale depends on that row alone). A tied head reads
the embedding's buffers: one copy of the matrix serves both.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_kernels import ColumnSplit, KernelBackend, dequantize_rows, quantize_per_row
from metrale_model_arch.allocator import TensorAllocator


class Int8Rows(nn.Module):
    """An int8 matrix and its per-row scales: :class:`Int8Linear`, :class:`Int8Embedding`."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.logical_shape = (rows, cols)
        self.register_buffer("qweight", torch.empty(rows, cols, dtype=torch.int8, device="meta"))
        self.register_buffer("scale", torch.empty(rows, dtype=torch.float32, device="meta"))

    def allocate(self, allocator: TensorAllocator, owner: str, device: torch.device) -> None:
        rows, cols = self.logical_shape
        self.qweight = allocator(owner, (rows, cols), torch.int8, device)
        self.scale = allocator(owner, (rows,), torch.float32, device)

    def write_rows(self, index: tuple[int | slice, ...], values: torch.Tensor) -> None:
        """Quantize ``values`` into rows ``index`` (``()``: all) of the matrix."""
        self.quantize_into(index, values)

    def quantize_into(
        self,
        index: tuple[int | slice, ...],
        values: torch.Tensor,
        *,
        split: ColumnSplit | None = None,
    ) -> None:
        """:meth:`write_rows`; with ``split``, ``values`` are a rank's columns of the rows,
        scaled as the whole rows are."""
        if len(index) > 1:
            raise ValueError(f"an int8 matrix is filled by whole rows, got index {index}")
        rows = index[0] if index else slice(None)
        q, scale = quantize_per_row(values.reshape(-1, self.logical_shape[1]), split=split)
        self.qweight[rows] = q.reshape(self.qweight[rows].shape)
        self.scale[rows] = scale.reshape(self.scale[rows].shape)

    def share(self, other: Int8Rows) -> None:
        """Read ``other``'s matrix (a head tied to the embeddings)."""
        self.qweight, self.scale = other.qweight, other.scale


class Int8Linear(Int8Rows):
    """``y = x @ W.T + b`` with ``W`` int8 per output channel; ``x``'s dtype out.

    ``tied_to``: the embedding module whose matrix this head reads (see :func:`tie_int8_heads`).
    """

    def __init__(
        self, linear: nn.Linear, backend: KernelBackend, tied_to: str | None = None
    ) -> None:
        super().__init__(linear.out_features, linear.in_features)
        self.bias = linear.bias
        self.backend = backend
        self.tied_to = tied_to

    def forward(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.backend.int8_linear(x, self.qweight, self.scale, self.bias, out=out)


class Int8Embedding(Int8Rows):
    """Rows of an int8 table, dequantized on lookup."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__(embedding.num_embeddings, embedding.embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.qweight[ids], self.scale[ids])


def swap_in_int8(
    model: nn.Module, linear_names: frozenset[str], backend: KernelBackend
) -> dict[str, Int8Rows]:
    """Replace every ``nn.Embedding`` and every ``nn.Linear`` whose attribute name is in
    ``linear_names`` with its int8 stand-in (on the meta device, before loading).

    Returns the stand-ins to fill, by the checkpoint parameter each replaces
    (``<module>.weight``). A head whose weight is an embedding's (tied) fills nothing of its own:
    it is not listed, and reads the embedding's buffers once :func:`tie_int8_heads` runs.
    """
    embedding_of = {
        id(module.weight): name
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding)
    }
    to_fill: dict[str, Int8Rows] = {}
    for name, module in list(model.named_modules()):
        replacement: Int8Rows
        if isinstance(module, nn.Embedding):
            replacement = Int8Embedding(module)
        elif isinstance(module, nn.Linear) and name.rpartition(".")[2] in linear_names:
            replacement = Int8Linear(module, backend, tied_to=embedding_of.get(id(module.weight)))
        else:
            continue
        if not isinstance(replacement, Int8Linear) or replacement.tied_to is None:
            to_fill[f"{name}.weight"] = replacement
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attribute, replacement)
    return to_fill


def tie_int8_heads(model: nn.Module) -> None:
    """After loading: each tied int8 head reads its embedding's filled buffers."""
    for module in model.modules():
        if isinstance(module, Int8Linear) and module.tied_to is not None:
            embedding = model.get_submodule(module.tied_to)
            assert isinstance(embedding, Int8Rows)
            module.share(embedding)
