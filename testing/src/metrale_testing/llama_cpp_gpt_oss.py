"""gpt-oss's tensors as llama.cpp's converter (``GptOssModel``) writes them: the sinks as a
``.weight``, the experts' interleaved ``gate_up_proj`` (and bias) split into gate (even) and up
(odd), each expert projection transposed to ``(experts, rows, cols)``; an MXFP4 checkpoint's
``*_blocks`` / ``*_scales`` repacked as ggml's MXFP4 blocks instead of dequantized."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import gguf
import numpy as np

BLOCKS, SCALES = "_blocks", "_scales"


@attrs.frozen(eq=False)
class RawTensor:
    """Bytes already in a ggml type: written as they are."""

    data: np.ndarray
    qtype: gguf.GGMLQuantizationType


def gpt_oss_tensors(
    tensors: Iterator[tuple[str, np.ndarray]],
) -> Iterator[tuple[str, np.ndarray | RawTensor]]:
    """``GptOssModel.modify_tensors`` and ``generate_extra_tensors`` over the checkpoint's
    tensors."""
    mxfp4_parts: dict[str, dict[str, np.ndarray]] = {}
    for name, data in tensors:
        if name.endswith((BLOCKS, SCALES)):
            prefix, suffix = name[: -len(BLOCKS)], name[-len(BLOCKS) :]
            parts = mxfp4_parts.setdefault(prefix, {})
            parts[suffix] = data
            if len(parts) == 2:
                del mxfp4_parts[prefix]
                yield from _split_experts(prefix, parts[BLOCKS], parts[SCALES])
        elif name.endswith("self_attn.sinks"):
            yield f"{name}.weight", data
        elif name.endswith("mlp.experts.gate_up_proj_bias"):
            prefix = name.removesuffix("gate_up_proj_bias")
            yield f"{prefix}gate_proj.bias", data[..., ::2]
            yield f"{prefix}up_proj.bias", data[..., 1::2]
        elif name.endswith("mlp.experts.down_proj_bias"):
            yield name.replace("down_proj_bias", "down_proj.bias"), data
        elif name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            # Float experts: transformers multiplies x @ w; llama.cpp stores w's rows.
            yield from _split_experts(name, np.ascontiguousarray(data.swapaxes(-1, -2)), None)
        else:
            yield name, data


def _split_experts(
    prefix: str, rows: np.ndarray, scales: np.ndarray | None
) -> Iterator[tuple[str, np.ndarray | RawTensor]]:
    """``prefix`` (``...mlp.experts.gate_up_proj`` or ``down_proj``) as ``(experts, rows,
    ...)`` float rows, or MXFP4 blocks with their ``scales``; gate_up split into gate and up."""

    def written(part: slice) -> np.ndarray | RawTensor:
        if scales is None:
            return np.ascontiguousarray(rows[:, part])
        return RawTensor(
            mxfp4_repacked(rows[:, part], scales[:, part]), gguf.GGMLQuantizationType.MXFP4
        )

    base = prefix.rsplit(".", 1)[0]
    if prefix.endswith("gate_up_proj"):
        yield f"{base}.gate_proj.weight", written(slice(0, None, 2))
        yield f"{base}.up_proj.weight", written(slice(1, None, 2))
    else:
        yield f"{base}.down_proj.weight", written(slice(None))


def mxfp4_repacked(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' MXFP4 ``blocks (..., groups, 16)`` (values ``2k`` and ``2k + 1`` in the low
    and high nibble of byte ``k``) and e8m0 ``scales (..., groups)`` -> ggml's MXFP4 rows
    ``(..., groups * 17)``: each block's scale byte, then values ``j`` and ``j + 16`` in the low
    and high nibble of byte ``j``."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    per_block = np.concatenate([scales[..., None], packed], axis=-1).astype(np.uint8)
    return np.ascontiguousarray(per_block.reshape(*blocks.shape[:-2], -1))
