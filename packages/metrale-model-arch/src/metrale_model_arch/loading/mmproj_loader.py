"""An image model from llama.cpp's two files: the text GGUF and its mmproj GGUF.

The text GGUF's tensors come through :mod:`.gguf_loader` (named as the text stack's
checkpoint names them, then put under the image model's text prefix); the mmproj's through
:mod:`~metrale_model_arch.families.mmproj_names`, dequantized, unshifted and joined back into
the checkpoint's fused tensors. The model is then built as from the safetensors checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

import gguf
import numpy as np
import torch

from metrale_config import (
    GgufHeader,
    GgufTensorInfo,
    ModelConfig,
    model_config_from_gguf_header,
    model_config_with_mmproj,
)
from metrale_model_arch.build import build_model
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.gguf_names import SKIPPED_GGUF_TENSORS
from metrale_model_arch.families.mmproj_names import (
    FRAME_PARTS,
    QKV_PARTS,
    MmprojPart,
    MmprojTensor,
    UnknownMmprojTensorError,
    mmproj_tensor,
)
from metrale_model_arch.gguf_dequant import dequantize
from metrale_model_arch.load_options import DEFAULT_LOAD_OPTIONS, LoadOptions
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.gguf_loader import SUPPORTED_GGML_TYPES, iter_gguf_checkpoint
from metrale_model_arch.loading.progress import load_progress
from metrale_model_arch.q4_1_blocks import Q4_1Blocks
from metrale_model_arch.weight_format import Quantization

# The image model's model type -> the prefix its checkpoint gives the text stack's ``model.``.
TEXT_PREFIX = {"gemma3": "model.language_model.", "qwen2_5_vl": "model."}
PROJECTOR_TYPE_KEY = "clip.projector_type"
_Weight = torch.Tensor | Q4_1Blocks


def load_gguf_model_with_mmproj(
    text: GgufHeader, mmproj: GgufHeader, options: LoadOptions = DEFAULT_LOAD_OPTIONS
) -> CausalLM:
    """Build the image model of the text GGUF ``text`` and the mmproj ``mmproj`` (their
    headers), as :func:`~metrale_model_arch.loading.gguf_loader.load_gguf_model` builds a text
    GGUF's."""
    text_config = model_config_from_gguf_header(text)
    config = model_config_with_mmproj(text_config, text, mmproj)
    num_tensors = sum(t.name not in SKIPPED_GGUF_TENSORS for t in text.tensors) + len(
        mmproj.tensors
    )
    with load_progress(
        num_tensors, f"Loading {Path(text.path).name}", on_progress=options.on_progress
    ) as advance:
        q4 = options.quantization == Quantization.Q4
        text_weights = iter_gguf_checkpoint(text, text_config, advance, q4_1_blocks=q4)
        weights = chain(_under_prefix(text_weights, config), iter_mmproj_weights(mmproj, advance))
        return build_model(config, weights, options)


def iter_mmproj_weights(
    mmproj: GgufHeader, on_tensor: Callable[[int], None] = lambda n: None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every tensor of the mmproj, float32 on the CPU, with
    the converter's shift undone and its splits joined. Unknown names, unsupported types and
    tensors past the end of the file raise :class:`CheckpointError` before anything is yielded."""
    projector = mmproj.fields.get(PROJECTOR_TYPE_KEY)
    plan = [(info, _target(mmproj, str(projector), info)) for info in mmproj.tensors]
    return _read(mmproj, plan, on_tensor)


def _target(mmproj: GgufHeader, projector: str, info: GgufTensorInfo) -> MmprojTensor:
    try:
        target = mmproj_tensor(projector, info.name)
    except UnknownMmprojTensorError as exc:
        raise CheckpointError(f"{mmproj.source}: {exc}") from exc
    if info.ggml_type not in SUPPORTED_GGML_TYPES:
        raise CheckpointError(
            f"{mmproj.source}: tensor {info.name!r} has type {info.ggml_type}, which is not "
            f"supported (supported: {', '.join(SUPPORTED_GGML_TYPES)})"
        )
    file_bytes = Path(mmproj.path).stat().st_size
    if info.data_offset + info.num_bytes > file_bytes:
        raise CheckpointError(
            f"{mmproj.source}: truncated; tensor {info.name!r} ends at byte "
            f"{info.data_offset + info.num_bytes} of a {file_bytes}-byte file"
        )
    return target


def _read(
    mmproj: GgufHeader,
    plan: list[tuple[GgufTensorInfo, MmprojTensor]],
    on_tensor: Callable[[int], None],
) -> Iterator[tuple[str, torch.Tensor]]:
    file_data = np.memmap(mmproj.path, dtype=np.uint8, mode="r")
    parts: dict[str, dict[MmprojPart, np.ndarray]] = {}
    for info, target in plan:
        values = _values(file_data, info)
        if target.stored_shift:
            values = values - np.float32(target.stored_shift)
        if target.part is None:
            yield target.hf_name, torch.from_numpy(values)
        else:
            found = parts.setdefault(target.hf_name, {})
            found[target.part] = values
            if (joined := _joined(found)) is not None:
                del parts[target.hf_name]
                yield target.hf_name, torch.from_numpy(joined)
        on_tensor(1)
    if parts:
        missing = {name: sorted(found) for name, found in parts.items()}
        raise CheckpointError(f"{mmproj.source}: split tensors with parts missing: {missing}")


def _values(file_data: np.ndarray, info: GgufTensorInfo) -> np.ndarray:
    """The tensor's float32 values, in writable memory."""
    ggml_type = gguf.GGMLQuantizationType[info.ggml_type]
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[ggml_type]
    row_length = info.shape[-1]
    raw = file_data[info.data_offset : info.data_offset + info.num_bytes]
    blocks = raw.reshape(*info.shape[:-1], row_length // block_size * block_bytes)
    values = dequantize(np.asarray(blocks), ggml_type)
    return values.copy() if not values.flags.writeable else values


def _joined(found: dict[MmprojPart, np.ndarray]) -> np.ndarray | None:
    """The checkpoint tensor once every part is there: q, k and v rows stacked; the two
    frames of ``(out, channels, patch, patch)`` as ``(out, channels, 2, patch, patch)``."""
    if found.keys() == set(QKV_PARTS):
        return np.concatenate([found[part] for part in QKV_PARTS])
    if found.keys() == set(FRAME_PARTS):
        return np.stack([found[part] for part in FRAME_PARTS], axis=2)
    return None


def _under_prefix(
    weights: Iterator[tuple[str, _Weight]], config: ModelConfig
) -> Iterator[tuple[str, _Weight]]:
    """The text stack's ``model.*`` names as the image model's checkpoint gives them."""
    prefix = TEXT_PREFIX[config.model_type]
    for name, tensor in weights:
        if name.startswith("model."):
            name = prefix + name.removeprefix("model.")
        yield name, tensor
