"""Checkpoint names of Kimi Linear -> the parameters of :class:`.model.KimiLinearForCausalLM`.

Moonshot's checkpoints (and transformers' saves) name a layer's FFN ``block_sparse_moe`` (its
experts' projections ``w1`` gate, ``w3`` up, ``w2`` down), the dense layers' ``mlp`` or
``block_sparse_moe``; both become ``mlp``. A GGUF load's experts come stacked per projection
(``mlp.experts.{gate,up,down}_proj.weight``). The rest are GLM-5.3's names
(:func:`~metrale_model_arch.families.glm5_next.mapping.layer_target`): the experts stacked,
``gate/up_proj`` fused, ``q/k/v_conv1d`` into one depthwise convolution, the forget gate's
tensors under ``forget_gate``; the router, its correction bias and KDA's convolution,
``dt_bias`` and ``A_log`` stay float32.
"""

from __future__ import annotations

import re

from metrale_config import ModelConfig
from metrale_model_arch.counts.moe import require_moe
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.glm5_next.mapping import layer_target

_LAYER = re.compile(r"model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
_FFN = re.compile(r"(?:block_sparse_moe|mlp)\.(?P<rest>.+)")
_EXPERT = re.compile(r"experts\.(?P<expert>\d+)\.(?P<proj>w1|w2|w3)\.weight")
# GGUF's experts: each projection stacked, ``(experts, rows, cols)``.
_STACKED = re.compile(r"mlp\.experts\.(?P<proj>gate_proj|up_proj|down_proj)\.weight")
_PROJECTION = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def kimi_linear_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    assert config.linear_attention is not None
    expert_rows = require_moe(config).moe_intermediate_size
    conv_rows = config.linear_attention.num_heads * config.linear_attention.head_dim
    num_layers = config.num_hidden_layers

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        layer = _LAYER.fullmatch(name)
        if layer is None:
            return TensorTarget(name)
        index, rest = int(layer["layer"]), layer["rest"]
        if index >= num_layers:
            return None
        if ffn := _FFN.fullmatch(rest):
            rest = ffn["rest"]
            if expert := _EXPERT.fullmatch(rest):
                rest = f"experts.{expert['expert']}.{_PROJECTION[expert['proj']]}.weight"
            rest = f"mlp.{rest}"
        if stacked := _STACKED.fullmatch(rest):
            return _stacked_target(
                f"model.layers.{index}.mlp.experts.", stacked["proj"], expert_rows
            )
        return layer_target(f"model.layers.{index}.", rest, shape, expert_rows, conv_rows)

    return target


def _stacked_target(prefix: str, proj: str, expert_rows: int) -> TensorTarget:
    if proj == "down_proj":
        return TensorTarget(f"{prefix}down_proj")
    half = slice(0, expert_rows) if proj == "gate_proj" else slice(expert_rows, None)
    return TensorTarget(f"{prefix}gate_up_proj", (slice(None), half))
