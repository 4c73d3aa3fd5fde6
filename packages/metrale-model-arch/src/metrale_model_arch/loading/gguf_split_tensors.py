"""Checkpoint tensors rebuilt from the two halves llama.cpp's converter splits them into.

MLA's ``kv_b_proj`` is ``(heads * (nope + v), kv_lora_rank)``: per head, ``nope`` key rows then
``v`` value rows. The converter stores each head's key rows transposed, as ``attn_k_b``
``(heads, kv_lora_rank, nope)``, and the value rows as ``attn_v_b`` ``(heads, v,
kv_lora_rank)`` (numpy order, the reverse of ggml's ``ne``).

gpt-oss's ``gate_up_proj`` (and its bias) interleaves the gate (even) and up (odd) columns of
each expert; the converter stores them apart as ``ffn_gate_exps`` and ``ffn_up_exps``.

Qwen3-Next's ``in_proj_qkvz`` holds, per key head, its q and k rows then the v and z rows of
its value heads; the converter stores the q, k and v rows of every key head in turn as
``attn_qkv`` (all q, all k, all v) and the z rows as ``attn_gate``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from metrale_model_arch.families.gguf_names import SplitRole


def join_split_tensor(
    halves: Mapping[SplitRole, np.ndarray], *, num_key_heads: int | None = None
) -> np.ndarray:
    """The checkpoint tensor from its two ``halves`` (Qwen3-Next's split needs the model's
    ``num_key_heads``); ``ValueError`` when they do not pair up."""
    if halves.keys() == {"qkv", "z"}:
        if num_key_heads is None:
            raise ValueError("attn_qkv and attn_gate need the linear attention's key heads")
        return join_qkvz(halves["qkv"], halves["z"], num_key_heads)
    if halves.keys() == {"k_b", "v_b"}:
        return join_kv_b(halves["k_b"], halves["v_b"])
    if halves.keys() == {"gate", "up"}:
        return interleave_gate_up(halves["gate"], halves["up"])
    raise ValueError(f"halves {sorted(halves)} do not make one tensor")


def join_kv_b(k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
    """``kv_b_proj`` from ``attn_k_b`` and ``attn_v_b``."""
    if k_b.ndim != 3 or v_b.ndim != 3:
        raise ValueError(f"attn_k_b {k_b.shape} and attn_v_b {v_b.shape} must be 3-D")
    num_heads, kv_lora_rank, _ = k_b.shape
    if v_b.shape[0] != num_heads or v_b.shape[2] != kv_lora_rank:
        raise ValueError(
            f"attn_k_b {k_b.shape} (heads, kv_lora_rank, nope) and attn_v_b {v_b.shape} "
            "(heads, v, kv_lora_rank) disagree on heads or kv_lora_rank"
        )
    # (heads, nope + v, kv_lora_rank) -> (heads * (nope + v), kv_lora_rank)
    per_head = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
    return np.ascontiguousarray(per_head.reshape(-1, kv_lora_rank))


def interleave_gate_up(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``(..., inter)`` gate and up -> ``(..., 2 * inter)``, gate at even, up at odd columns."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} differ in shape")
    return np.stack([gate, up], axis=-1).reshape(*gate.shape[:-1], 2 * gate.shape[-1])


def join_qkvz(qkv: np.ndarray, z: np.ndarray, num_key_heads: int) -> np.ndarray:
    """``in_proj_qkvz`` from ``attn_qkv`` ``(2 * key_width + value_width, hidden)`` and
    ``attn_gate`` ``(value_width, hidden)``."""
    value_width, hidden = z.shape
    key_width, remainder = divmod(qkv.shape[0] - value_width, 2)
    if remainder or key_width <= 0 or key_width % num_key_heads or value_width % num_key_heads:
        raise ValueError(
            f"attn_qkv {qkv.shape} and attn_gate {z.shape} do not split into "
            f"{num_key_heads} key heads"
        )
    q, k, v = np.split(qkv, [key_width, 2 * key_width])
    # (key heads, q | k | v | z rows of the head, hidden)
    per_head = [part.reshape(num_key_heads, -1, hidden) for part in (q, k, v, z)]
    return np.ascontiguousarray(np.concatenate(per_head, axis=1).reshape(-1, hidden))
