"""The q4 projection of a GPTQ ``desc_act`` checkpoint: columns sorted by group, inputs gathered.

GPTQ's act-order assigns input features to groups by ``g_idx`` in any order, so a block of 32
consecutive features can mix groups, which one ``(d, m)`` per block cannot hold. Sorting the
columns by group (a stable sort of ``g_idx``) makes every block one group's; the layer keeps
that ``input_order`` and computes ``x[:, input_order] @ W[:, input_order].T``, the same
product. A fused projection (q/k/v, gate/up) has one input, so its parts must share one order
(GPTQ derives it from the same activations, so they do); parts that differ are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from metrale_kernels import KernelBackend
from metrale_model_arch.allocator import TensorAllocator
from metrale_model_arch.families.q4_layers import Q4Linear
from metrale_model_arch.int4_blocks import Int4Blocks
from metrale_model_arch.int4_format import INPUT_ORDER_DTYPE
from metrale_model_arch.q4_1_blocks import Q4_1Blocks


class OrderedQ4Linear(Q4Linear):
    """``y = x @ W.T + b`` from q4 blocks over the columns ``input_order`` picks.

    NOTE: a type of its own, so the native executor (which takes ``Q4Linear`` exactly) leaves a
    model with these layers to the eager path, which runs :meth:`forward`.
    """

    input_order: torch.Tensor

    def __init__(self, linear: nn.Linear, backend: KernelBackend) -> None:
        super().__init__(linear, backend)
        self.register_buffer(
            "input_order",
            torch.empty(linear.in_features, dtype=INPUT_ORDER_DTYPE, device="meta"),
        )
        self._has_order = False

    def allocate(self, allocator: TensorAllocator, owner: str, device: torch.device) -> None:
        super().allocate(allocator, owner, device)
        self.input_order = allocator(owner, (self.logical_shape[1],), INPUT_ORDER_DTYPE, device)

    def write_rows(self, index: tuple[int | slice, ...], values: torch.Tensor | Q4_1Blocks) -> None:
        """Move an int4 checkpoint's blocks (``Int4Blocks`` with an input order) into rows
        ``index``; raises ``ValueError`` for anything else or for a second, different order."""
        if not isinstance(values, Int4Blocks) or values.input_order is None:
            raise ValueError("a desc_act q4 projection takes a GPTQ checkpoint's blocks only")
        order = values.input_order
        if not self._has_order:
            self.input_order.copy_(order)
            self._has_order = True
        elif not torch.equal(self.input_order, order.to(self.input_order.device)):
            raise ValueError(
                "the parts of a fused projection have different g_idx orders; one input "
                "cannot be gathered two ways"
            )
        super().write_rows(index, values.ordered_q4_1_blocks())

    def forward(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x.index_select(-1, self.input_order), out=out)


def order_q4_inputs(model: nn.Module, q4_linears: dict[str, Q4Linear]) -> dict[str, Q4Linear]:
    """Replace each of ``q4_linears`` (by checkpoint parameter name, on the meta device) with
    an :class:`OrderedQ4Linear`; the replacements by the same names."""
    ordered: dict[str, Q4Linear] = {}
    for param_name, linear in q4_linears.items():
        module_name = param_name.removesuffix(".weight")
        rows, cols = linear.logical_shape
        stand_in = nn.Linear(cols, rows, bias=linear.bias is not None, device="meta")
        replacement = OrderedQ4Linear(stand_in, linear.backend)
        parent_name, _, attribute = module_name.rpartition(".")
        setattr(model.get_submodule(parent_name), attribute, replacement)
        ordered[param_name] = replacement
    return ordered
