"""What an AWQ or GPTQ int4 checkpoint can be served as, and what its q4 form costs beyond q4.

Its projections become q4 blocks (:mod:`~metrale_model_arch.weight_format`): a group's scale is
each of its blocks' ``d``, ``-z * s`` their ``m``, so a group must be whole blocks of 32. GPTQ's
``desc_act`` gives each input feature its group by ``g_idx`` in any order; the q4 form holds the
columns sorted by group and an ``input_order`` (int64, one per input feature of each
projection) that gathers the activations the same way
(:class:`~metrale_model_arch.families.int4_layers.OrderedQ4Linear`): priced here.
"""

from __future__ import annotations

import torch

from metrale_config import ModelConfig
from metrale_kernels.reference.q4_matmul import Q4_BLOCK
from metrale_model_arch.registry import param_counts, planned_architecture

INPUT_ORDER_DTYPE = torch.int64
INPUT_ORDER_BYTES = 8
# The llama family's model types: fused q/k/v and gate/up projections of one input each.
INT4_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def has_input_order(config: ModelConfig) -> bool:
    """Whether ``config``'s q4 projections gather their inputs (GPTQ ``desc_act``)."""
    int4 = config.int4_quantization
    return int4 is not None and int4.desc_act


def int4_support_error(config: ModelConfig) -> str | None:
    """Why ``config``'s AWQ/GPTQ checkpoint cannot be read, or None (also None without one)."""
    int4 = config.int4_quantization
    if int4 is None:
        return None
    if config.model_type not in INT4_MODEL_TYPES or not planned_architecture(config).int8_linears:
        supported = ", ".join(sorted(INT4_MODEL_TYPES))
        return (
            f"{config.model_type}: {int4.method} int4 checkpoints are read for the llama family "
            f"only ({supported})"
        )
    if int4.group_size is not None and int4.group_size % Q4_BLOCK:
        return (
            f"quantization_config.group_size {int4.group_size}: groups must be whole q4 blocks "
            f"of {Q4_BLOCK} input features"
        )
    for rows, cols in param_counts(config).layers_projection_shapes:
        group = int4.group_size or cols
        if cols % group or cols % Q4_BLOCK or rows % 8:
            return (
                f"a ({rows}, {cols}) projection: {int4.describe()} needs input features in "
                f"whole groups and blocks of {Q4_BLOCK}, output features in packs of 8"
            )
    return None


def input_order_bytes(config: ModelConfig) -> int:
    """The q4 projections' input orders: one int64 per input feature (0 without desc_act)."""
    if not has_input_order(config):
        return 0
    columns = sum(cols for _, cols in param_counts(config).layers_projection_shapes)
    return columns * INPUT_ORDER_BYTES
