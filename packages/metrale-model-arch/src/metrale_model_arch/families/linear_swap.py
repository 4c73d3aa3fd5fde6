"""Putting a quantized format's stand-ins in place of a model's projections before loading."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

StandIn = TypeVar("StandIn", bound=nn.Module)


def swap_in_linears(
    model: nn.Module, linear_names: frozenset[str], stand_in: Callable[[nn.Linear], StandIn]
) -> dict[str, StandIn]:
    """Replace every ``nn.Linear`` whose attribute name is in ``linear_names`` with
    ``stand_in(linear)`` (on the meta device, before loading); the stand-ins by the checkpoint
    parameter each replaces (``<module>.weight``). A ``ValueError`` of ``stand_in`` is raised
    again naming the module."""
    to_fill: dict[str, StandIn] = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or name.rpartition(".")[2] not in linear_names:
            continue
        try:
            replacement = stand_in(module)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
        to_fill[f"{name}.weight"] = replacement
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attribute, replacement)
    return to_fill
