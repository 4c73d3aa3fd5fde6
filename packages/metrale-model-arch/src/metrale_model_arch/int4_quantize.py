"""Quantize a float llama-family checkpoint to an AWQ- or GPTQ-layout int4 one: round to nearest.

The projections (``q/k/v/o_proj``, ``gate/up/down_proj`` of every layer) are quantized per group
of ``group_size`` input features and packed as :mod:`~metrale_model_arch.loading.int4_checkpoints`
reads them; every other tensor is stored as float16. Per group, asymmetric: ``s = (max - min)
/ 15`` (both clamped to include 0), ``z = round(-min / s)``; symmetric (GPTQ only): ``s = 2
max|w| / 15``, ``z = 8``; then ``q = clamp(round(w / s) + z, 0, 15)``. No calibration (no
activation-aware scaling, no Hessian): what AWQ and GPTQ start from, in their on-disk layouts,
so their loading and serving can be measured on any float model (``benches/format_quality.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from metrale_config import Int4Method, ModelConfig
from metrale_model_arch.int4_format import INT4_MODEL_TYPES

PROJECTION = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)
_MIN_SCALE = 1e-8


def quantize_int4(
    weight: torch.Tensor, group_size: int, *, method: Int4Method, is_symmetric: bool = False
) -> dict[str, torch.Tensor]:
    """``weight (out, in)`` -> its ``qweight``, ``qzeros``, ``scales`` (and GPTQ's ``g_idx``)."""
    rows, cols = weight.shape
    if cols % group_size or rows % 8 or group_size % 8:
        raise ValueError(f"a ({rows}, {cols}) matrix is not whole groups of {group_size} and 8s")
    groups = weight.detach().to(torch.float32).reshape(rows, cols // group_size, group_size)
    low, high = groups.amin(dim=-1).clamp(max=0), groups.amax(dim=-1).clamp(min=0)
    if is_symmetric:
        scales = (torch.maximum(-low, high) * 2 / 15).clamp(min=_MIN_SCALE).to(torch.float16)
        zeros = torch.full_like(low, 8, dtype=torch.int64)
    else:
        scales = ((high - low) / 15).clamp(min=_MIN_SCALE).to(torch.float16)
        zeros = torch.round(-low / scales.float()).clamp(0, 15).to(torch.int64)
        if method == Int4Method.GPTQ:
            zeros = zeros.clamp(min=1)  # v1 stores z - 1 in a nibble
    levels = torch.round(groups / scales.float().unsqueeze(-1)) + zeros.unsqueeze(-1)
    values = levels.clamp(0, 15).to(torch.int64).reshape(rows, cols)
    if method == Int4Method.AWQ:
        return {
            "qweight": _pack_last(values.t(), AWQ_ORDER),
            "qzeros": _pack_last(zeros.t(), AWQ_ORDER),
            "scales": scales.t().contiguous(),
        }
    return {
        "qweight": _pack_last(values, tuple(range(8))).t().contiguous(),
        "qzeros": _pack_last(zeros.t() - 1, tuple(range(8))),
        "scales": scales.t().contiguous(),
        "g_idx": (torch.arange(cols) // group_size).to(torch.int32),
    }


def _pack_last(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """int ``(r, 8c)`` -> int32 ``(r, c)``: nibble ``i`` holds column ``8j + order[i]``."""
    rows = values.shape[0]
    eights = values.reshape(rows, -1, 8)[:, :, list(order)]
    packed = (eights << _SHIFTS).sum(dim=-1)
    return torch.from_numpy(packed.numpy().astype(np.uint32).view(np.int32))


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """``config.json`` fields of a llama-family ``config`` (no RoPE scaling)."""
    if config.model_type not in INT4_MODEL_TYPES or config.rope_scaling is not None:
        raise ValueError(f"{config.model_type}: only plain llama-family configs are written")
    return {
        "model_type": config.model_type,
        "architectures": list(config.architectures) or ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) or None,
        "torch_dtype": "float16",
    }


def write_int4_checkpoint(
    out_dir: str | Path,
    config: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    method: Int4Method,
    group_size: int,
    is_symmetric: bool = False,
) -> Path:
    """Write ``config``'s model (``weights`` under checkpoint names, a tied head omitted) to
    ``out_dir`` as ``config.json`` and ``model.safetensors``, its projections ``method`` int4."""
    if method == Int4Method.AWQ and is_symmetric:
        raise ValueError("AWQ has zero points: is_symmetric is GPTQ's")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        if PROJECTION.fullmatch(name):
            prefix = name.removesuffix(".weight")
            parts = quantize_int4(tensor, group_size, method=method, is_symmetric=is_symmetric)
            tensors.update((f"{prefix}.{part}", packed) for part, packed in parts.items())
        else:
            tensors[name] = tensor.to(torch.float16).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    quantization: dict[str, Any] = {
        "quant_method": str(method),
        "bits": 4,
        "group_size": group_size,
    }
    if method == Int4Method.AWQ:
        quantization.update(zero_point=True, version="gemm")
    else:
        quantization.update(sym=is_symmetric, desc_act=False, checkpoint_format="gptq")
    hf = {**hf_config(config), "quantization_config": quantization}
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    return out
