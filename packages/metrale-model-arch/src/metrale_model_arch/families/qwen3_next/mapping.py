"""Qwen3-Next's checkpoint names -> its parameters."""

from __future__ import annotations

import re

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.llama import qkv_sizes
from metrale_model_arch.families.moe import moe_checkpoint_mapping
from metrale_model_arch.owners import MTP_PARAM_PREFIX

_ATTENTION = re.compile(r"(?P<prefix>.+\.self_attn)\.(?P<part>[qkv])_proj\.(?P<kind>weight|bias)")
_MTP_LAYER = re.compile(r"mtp\.layers\.(?P<layer>\d+)\.(?P<rest>.+)")
# The predictor's own weights beside its layers (held by MTP layer 0).
_MTP_OWN = re.compile(
    r"mtp\.(?P<rest>(?:fc|pre_fc_norm_embedding|pre_fc_norm_hidden|norm)\.weight)"
)


def qwen3_next_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    """The MoE families' names (experts stacked, gate/up fused, the shared expert's too), the
    gated q projection (twice the query rows) and k and v fused into ``qkv_proj``. The
    checkpoint's MTP weights (``mtp.*``, :mod:`.mtp`) load into ``model.mtp_layers`` when the
    config keeps MTP layers: ``mtp.layers.k.*`` into layer ``k`` (named as a stack layer's),
    ``mtp.fc`` and the ``mtp`` norms into layer 0; skipped when it keeps none (as transformers
    skips them) and past its count."""
    routed = moe_checkpoint_mapping(config)
    num_mtp = config.mtp.num_layers if config.mtp is not None else 0
    q_size, kv_size = qkv_sizes(config)
    rows = {
        "q": slice(0, 2 * q_size),
        "k": slice(2 * q_size, 2 * q_size + kv_size),
        "v": slice(2 * q_size + kv_size, 2 * q_size + 2 * kv_size),
    }

    def layer_target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if match := _ATTENTION.fullmatch(name):
            fused = f"{match['prefix']}.qkv_proj.{match['kind']}"
            return TensorTarget(fused, (rows[match["part"]],))
        return routed(name, shape)

    def mtp_target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if num_mtp == 0:
            return Skip("an MTP layer (loaded only for MTP speculation)")
        if own := _MTP_OWN.fullmatch(name):
            return TensorTarget(f"{MTP_PARAM_PREFIX}0.{own['rest']}")
        layer = _MTP_LAYER.fullmatch(name)
        if layer is None:
            return None
        index = int(layer["layer"])
        if index >= num_mtp:
            return Skip(f"MTP layer {index}: beyond the config's {num_mtp} MTP layer(s)")
        # Mapped as stack layer ``index`` would be, then moved under the MTP layers.
        stack_prefix = f"model.layers.{index}."
        mapped = layer_target(stack_prefix + layer["rest"], shape)
        if not isinstance(mapped, TensorTarget):
            return mapped
        assert mapped.param.startswith(stack_prefix)
        moved = f"{MTP_PARAM_PREFIX}{index}.{mapped.param[len(stack_prefix) :]}"
        return attrs.evolve(mapped, param=moved)

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if name.startswith("mtp."):
            return mtp_target(name, shape)
        return layer_target(name, shape)

    return target
