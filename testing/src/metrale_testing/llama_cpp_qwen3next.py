"""Qwen3-Next as llama.cpp's converter (``Qwen3NextModel``, a ``Qwen2MoeModel``) writes it:
``TextModel``'s keys with the expert counts, the expert and shared-expert widths, the ``ssm``
sizes, the full-attention interval and the rotated dims; ``A_log`` as ``-exp(A_log)``,
``dt_bias`` as ``ssm_dt.bias``, the conv1d weight squeezed to ``(channels, kernel)``, every
norm but the Gated DeltaNet's gated one stored ``+ 1``, ``in_proj_qkvz`` regrouped into
``attn_qkv`` (all q heads, all k heads, all v heads) and ``attn_gate`` (z), and the MTP layers
(``mtp.*``) dropped."""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from metrale_testing.llama_cpp_text_model import Hparams, text_model_metadata


def qwen3next_metadata(writer: gguf.GGUFWriter, hparams: Hparams, num_blocks: int) -> None:
    """``Qwen3NextModel.set_gguf_parameters``."""
    text_model_metadata(writer, hparams, num_blocks)
    writer.add_expert_count(hparams["num_experts"])
    writer.add_expert_used_count(hparams["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(hparams["shared_expert_intermediate_size"])
    writer.add_ssm_conv_kernel(hparams["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(hparams["linear_key_head_dim"])
    writer.add_ssm_group_count(hparams["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(hparams["linear_num_value_heads"])
    writer.add_ssm_inner_size(hparams["linear_value_head_dim"] * hparams["linear_num_value_heads"])
    writer.add_full_attention_interval(hparams.get("full_attention_interval", 4))
    head_dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    partial = hparams.get("rope_parameters", {}).get(
        "partial_rotary_factor", hparams.get("partial_rotary_factor", 0.25)
    )
    writer.add_rope_dimension_count(int(head_dim * partial))


def qwen3next_tensors(
    tensors: Iterator[tuple[str, np.ndarray]], hparams: Hparams
) -> Iterator[tuple[str, np.ndarray]]:
    """``Qwen3NextModel.filter_tensors`` and ``modify_tensors`` over the checkpoint's tensors
    (named so that gguf-py's tensor map gives llama.cpp's names)."""
    for name, data in tensors:
        if name.startswith("mtp"):
            continue
        if name.endswith(".A_log"):
            data = -np.exp(data.astype(np.float32))
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif "conv1d" in name:
            data = data.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            data = data + np.float32(1.0)
        if name.endswith("in_proj_qkvz.weight"):
            prefix = name.removesuffix("in_proj_qkvz.weight")
            qkv, z = split_qkvz(data, hparams)
            yield f"{prefix}in_proj_qkv.weight", qkv
            yield f"{prefix}in_proj_z.weight", z
        else:
            yield name, data


def split_qkvz(qkvz: np.ndarray, hparams: Hparams) -> tuple[np.ndarray, np.ndarray]:
    """``in_proj_qkvz`` (per key head: q, k, then its value heads' v and z rows) -> the q, k
    and v rows of every head in turn, and the z rows."""
    num_key_heads = hparams["linear_num_key_heads"]
    key_dim = hparams["linear_key_head_dim"]
    group_width = (
        hparams["linear_num_value_heads"] // num_key_heads * hparams["linear_value_head_dim"]
    )
    per_head = qkvz.reshape(num_key_heads, -1, qkvz.shape[-1])
    ends = np.cumsum([key_dim, key_dim, group_width])
    q, k, v, z = np.split(per_head, ends, axis=1)
    qkv = np.concatenate([part.reshape(-1, qkvz.shape[-1]) for part in (q, k, v)])
    return qkv, np.ascontiguousarray(z.reshape(-1, qkvz.shape[-1]))
