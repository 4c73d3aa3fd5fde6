"""Tiny AWQ and GPTQ int4 llama checkpoints, packed here exactly as the public layouts say.

Our own quantizer and packers (round to nearest per group), independent of the loader's
unpacking: AutoAWQ's ``WQLinear_GEMM`` (``qweight`` ``(in, out / 8)`` with outputs
``(0, 2, 4, 6, 1, 3, 5, 7)`` in nibbles 0..7, ``qzeros`` ``(groups, out / 8)`` the same,
``scales`` ``(groups, out)``) and GPTQ v1 (``qweight`` ``(in / 8, out)`` inputs in order,
``qzeros`` holding ``z - 1``, ``scales``, ``g_idx`` ``(in,)``). Everything heavy is imported
inside the helpers (see ``metrale_testing``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
HIDDEN = 64
INTERMEDIATE = 128
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN // NUM_HEADS
PROJECTIONS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def llama_config(
    vocab_size: int, quantization_config: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "quantization_config": quantization_config,
        **extra,
    }


def quantization_config(
    method: str, group_size: int, *, sym: bool = True, desc_act: bool = False
) -> dict[str, Any]:
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size,
                "zero_point": True, "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": desc_act,
            "sym": sym, "checkpoint_format": "gptq", "damp_percent": 0.01,
            "true_sequential": True, "static_groups": False}  # fmt: skip


def round_to_nearest(
    weight: torch.Tensor, group_of: torch.Tensor, num_groups: int, *, sym: bool, min_zero: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight (out, in)`` -> ``q`` uint8 ``(out, in)``, ``z`` int64 and ``s`` float16
    ``(out, groups)``: asymmetric ``s = (max - min) / 15``, ``z = round(-min / s)`` (at least
    ``min_zero``); symmetric ``s = 2 max|w| / 15``, ``z = 8``."""
    import torch

    rows = weight.shape[0]
    scales = torch.empty(rows, num_groups, dtype=torch.float16)
    zeros = torch.empty(rows, num_groups, dtype=torch.int64)
    for group in range(num_groups):
        part = weight[:, group_of == group]
        low = part.amin(dim=1).clamp(max=0)
        high = part.amax(dim=1).clamp(min=0)
        if sym:
            scale = (torch.maximum(-low, high) * 2 / 15).clamp(min=1e-4).to(torch.float16)
            zero = torch.full((rows,), 8)
        else:
            scale = ((high - low) / 15).clamp(min=1e-4).to(torch.float16)
            zero = torch.round(-low / scale.float()).clamp(min_zero, 15).to(torch.int64)
        scales[:, group], zeros[:, group] = scale, zero
    expanded_s, expanded_z = scales[:, group_of].float(), zeros[:, group_of]
    values = (torch.round(weight / expanded_s) + expanded_z).clamp(0, 15).to(torch.uint8)
    return values, zeros, scales


def random_levels(
    rows: int,
    cols: int,
    num_groups: int,
    generator: torch.Generator,
    *,
    zero_range: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Any ``q``, ``z`` in ``zero_range`` (inclusive) and ``s``: all a layout can hold."""
    import torch

    values = torch.randint(0, 16, (rows, cols), generator=generator).to(torch.uint8)
    low, high = zero_range
    zeros = torch.randint(low, high + 1, (rows, num_groups), generator=generator)
    scales = (torch.rand(rows, num_groups, generator=generator) * 0.05 + 0.001).to(torch.float16)
    return values, zeros, scales


def _to_int32(packed: torch.Tensor) -> torch.Tensor:
    import numpy as np
    import torch

    return torch.from_numpy(packed.numpy().astype(np.uint32).view(np.int32))


def pack_awq(
    values: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor
) -> dict[str, torch.Tensor]:
    import torch

    def pack_outputs(by_output: torch.Tensor) -> torch.Tensor:  # (r, out) -> (r, out / 8)
        packed = torch.zeros(by_output.shape[0], by_output.shape[1] // 8, dtype=torch.int64)
        for nibble, output in enumerate(AWQ_ORDER):
            packed |= by_output[:, output::8].to(torch.int64) << (4 * nibble)
        return _to_int32(packed)

    return {
        "qweight": pack_outputs(values.t()),
        "qzeros": pack_outputs(zeros.t()),
        "scales": scales.t().contiguous(),
    }


def pack_gptq(
    values: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_of: torch.Tensor
) -> dict[str, torch.Tensor]:
    import torch

    by_input = values.t().to(torch.int64)  # (in, out)
    qweight = torch.zeros(by_input.shape[0] // 8, by_input.shape[1], dtype=torch.int64)
    for nibble in range(8):
        qweight |= by_input[nibble::8, :] << (4 * nibble)
    stored = zeros.t().to(torch.int64) - 1  # v1: z - 1
    assert bool((stored >= 0).all())
    assert bool((stored <= 15).all())
    qzeros = torch.zeros(stored.shape[0], stored.shape[1] // 8, dtype=torch.int64)
    for nibble in range(8):
        qzeros |= stored[:, nibble::8] << (4 * nibble)
    return {
        "qweight": _to_int32(qweight),
        "qzeros": _to_int32(qzeros),
        "scales": scales.t().contiguous(),
        "g_idx": group_of.to(torch.int32),
    }


def save_int4_llama(
    path: Path,
    *,
    method: str,
    group_size: int,
    sym: bool = True,
    desc_act: bool = False,
    levels: str = "rtn",
    vocab_size: int = 256,
    seed: int = 0,
    **config_extra: Any,
) -> dict[str, torch.Tensor]:
    """Save a 2-layer llama (hidden 64, intermediate 128, GQA) whose projections are ``method``
    int4 (``levels``: ``rtn`` of random float weights, or ``random`` levels) to ``path``:
    ``config.json`` and ``model.safetensors``, the rest float16. Returns every weight as the
    layout says it is, float32 under the checkpoint's float names (``<projection>.weight``)."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    q_size, kv_size = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    shapes = {"q_proj": (q_size, HIDDEN), "k_proj": (kv_size, HIDDEN),
              "v_proj": (kv_size, HIDDEN), "o_proj": (HIDDEN, q_size),
              "gate_proj": (INTERMEDIATE, HIDDEN), "up_proj": (INTERMEDIATE, HIDDEN),
              "down_proj": (HIDDEN, INTERMEDIATE)}  # fmt: skip

    def float16(*shape: int, scale: float = 0.3, offset: float = 0.0) -> torch.Tensor:
        return (torch.randn(shape, generator=generator) * scale + offset).to(torch.float16)

    stored: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": float16(vocab_size, HIDDEN),
        "model.norm.weight": float16(HIDDEN, scale=0.1, offset=1.0),
        "lm_head.weight": float16(vocab_size, HIDDEN),
    }
    # Input orders shared by the projections of one input (GPTQ derives them from it).
    orders: dict[int, torch.Tensor] = {}
    for layer in range(NUM_LAYERS):
        prefix = f"model.layers.{layer}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            stored[f"{prefix}.{norm}.weight"] = float16(HIDDEN, scale=0.1, offset=1.0)
        for module, names in PROJECTIONS.items():
            for name in names:
                rows, cols = shapes[name]
                num_groups = cols // group_size
                in_order = torch.arange(cols) // group_size
                group_of = in_order
                if desc_act:
                    key = {"o_proj": 1, "down_proj": 2, "gate_proj": 3, "up_proj": 3}.get(
                        name, 0
                    ) * 100 + layer
                    if key not in orders:
                        orders[key] = torch.randperm(cols, generator=generator)
                    group_of = torch.empty_like(in_order)
                    group_of[orders[key]] = in_order
                if levels == "random":
                    zero_range = (0, 15) if method == "awq" else (1, 16)
                    q, z, s = random_levels(
                        rows, cols, num_groups, generator, zero_range=zero_range
                    )
                else:
                    weight = torch.randn(rows, cols, generator=generator) * 0.3
                    min_zero = 0 if method == "awq" else 1
                    q, z, s = round_to_nearest(
                        weight, group_of, num_groups, sym=sym and method == "gptq",
                        min_zero=min_zero,
                    )  # fmt: skip
                parts = pack_awq(q, z, s) if method == "awq" else pack_gptq(q, z, s, group_of)
                for part, tensor in parts.items():
                    stored[f"{prefix}.{module}.{name}.{part}"] = tensor
                truth = (q.float() - z[:, group_of].float()) * s[:, group_of].float()
                stored_float = f"{prefix}.{module}.{name}.weight"
                stored[f"__truth__.{stored_float}"] = truth
    truths = {
        name.removeprefix("__truth__."): stored.pop(name)
        for name in list(stored)
        if name.startswith("__truth__.")
    }
    path.mkdir(parents=True, exist_ok=True)
    save_file(stored, str(path / "model.safetensors"), metadata={"format": "pt"})
    quantization = quantization_config(method, group_size, sym=sym, desc_act=desc_act)
    config = llama_config(vocab_size, quantization, **config_extra)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weights = {name: t.float() for name, t in stored.items() if not name.endswith(_PACKED)}
    return {**weights, **truths}


_PACKED = (".qweight", ".qzeros", ".scales", ".g_idx")
