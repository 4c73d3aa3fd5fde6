"""Qwen3-Next's checkpoint names -> its parameters."""

from __future__ import annotations

import re

from metrale_config import ModelConfig
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.families.llama import qkv_sizes
from metrale_model_arch.families.moe import moe_checkpoint_mapping

_ATTENTION = re.compile(r"(?P<prefix>.+\.self_attn)\.(?P<part>[qkv])_proj\.(?P<kind>weight|bias)")


def qwen3_next_checkpoint_mapping(config: ModelConfig) -> CheckpointMapping:
    """The MoE families' names (experts stacked, gate/up fused, the shared expert's too), the
    gated q projection (twice the query rows) and k and v fused into ``qkv_proj``; the
    checkpoint's MTP layers (``mtp.*``) skipped, as transformers skips them."""
    routed = moe_checkpoint_mapping(config)
    q_size, kv_size = qkv_sizes(config)
    rows = {
        "q": slice(0, 2 * q_size),
        "k": slice(2 * q_size, 2 * q_size + kv_size),
        "v": slice(2 * q_size + kv_size, 2 * q_size + 2 * kv_size),
    }

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if name.startswith("mtp."):
            return Skip("an MTP layer (not loaded)")
        if match := _ATTENTION.fullmatch(name):
            fused = f"{match['prefix']}.qkv_proj.{match['kind']}"
            return TensorTarget(fused, (rows[match["part"]],))
        return routed(name, shape)

    return target
