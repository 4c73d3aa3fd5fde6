"""Read a GGUF checkpoint's tensors as checkpoint-named float32 tensors, dequantized at load.

llama.cpp names become checkpoint names through the architecture record's ``gguf_names``; the
model is then built through the family's checkpoint mapping, like a safetensors checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import gguf
import numpy as np
import torch

from metrale_config import (
    GgufHeader,
    GgufTensorInfo,
    ModelConfig,
    model_config_from_gguf_header,
    read_gguf_header,
)
from metrale_model_arch.build import build_model
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.gguf_names import (
    SKIPPED_GGUF_TENSORS,
    SplitRole,
    UnknownGgufTensorError,
)
from metrale_model_arch.gguf_dequant import dequantize
from metrale_model_arch.load_options import DEFAULT_LOAD_OPTIONS, LoadOptions
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.gguf_split_tensors import join_split_tensor
from metrale_model_arch.loading.progress import load_progress
from metrale_model_arch.q4_1_blocks import Q4_1Blocks, dense
from metrale_model_arch.registry import planned_architecture
from metrale_model_arch.weight_format import Quantization

SUPPORTED_GGML_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "MXFP4")


@attrs.frozen(kw_only=True)
class _PlannedTensor:
    info: GgufTensorInfo
    hf_name: str
    ggml_type: gguf.GGMLQuantizationType
    # Rows are unpermuted in groups of this many heads; None when stored as-is.
    num_permuted_heads: int | None
    # Subtracted from the values: what llama.cpp's converter added (gemma's norms).
    stored_shift: float = 0.0
    # Which half of ``hf_name`` this tensor holds (joined with the other); None: all of it.
    split_role: SplitRole | None = None
    # Stored with its last two axes swapped (gpt-oss's experts).
    is_transposed: bool = False
    # Stored as -exp(x) of the checkpoint's x (Qwen3-Next's A_log).
    is_negated_exp: bool = False
    # A depthwise conv1d weight stored with its unit axes dropped or moved.
    is_squeezed: bool = False


def read_gguf_weights(
    path: str | os.PathLike[str],
) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor]]]:
    """The config of the GGUF file at ``path`` and an iterator over its weights.

    See :func:`iter_gguf_weights`. A missing, truncated or corrupt file raises one error naming
    the file (``ConfigError`` for the header, :class:`CheckpointError` for the tensors).
    """
    header = read_gguf_header(path)
    config = model_config_from_gguf_header(header)
    return config, iter_gguf_weights(header, config)


def iter_gguf_weights(
    header: GgufHeader,
    config: ModelConfig,
    on_tensor: Callable[[int], None] = lambda n: None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every tensor of ``header``'s file, float32 on the CPU.

    Each tensor is dequantized when it is reached (types ``SUPPORTED_GGML_TYPES``), laid out
    row-major as PyTorch expects, with llama.cpp's rotary permutation of the Q/K rows, its
    shift of the ``(1 + w)`` norm weights, its transposition of gpt-oss's experts, its
    ``-exp(A_log)`` and reshaped conv1d kernels (Qwen3-Next, Kimi Linear) and its splits (MLA's
    ``kv_b_proj``, gpt-oss's ``gate_up_proj``, Qwen3-Next's ``in_proj_qkvz``) undone.
    There is no ``lm_head.weight`` when the file ties it to the embedding. Unknown tensor names,
    unsupported types and tensors past the end of the file raise :class:`CheckpointError`
    before anything is yielded.
    """
    tensors = iter_gguf_checkpoint(header, config, on_tensor, q4_1_blocks=False)
    return ((name, dense(tensor)) for name, tensor in tensors)


def iter_gguf_checkpoint(
    header: GgufHeader,
    config: ModelConfig,
    on_tensor: Callable[[int], None] = lambda n: None,
    *,
    q4_1_blocks: bool,
) -> Iterator[tuple[str, torch.Tensor | Q4_1Blocks]]:
    """:func:`iter_gguf_weights`, but with ``q4_1_blocks`` a Q4_1 matrix comes as its blocks
    (:class:`~metrale_model_arch.q4_1_blocks.Q4_1Blocks`, rows in the same order),
    for :func:`~metrale_model_arch.build.build_model` to keep as they are in a q4 model."""
    plan = _plan(header, config)
    linear = config.linear_attention
    num_key_heads = None if linear is None else linear.num_key_heads
    return _read_tensors(header.path, plan, on_tensor, q4_1_blocks, num_key_heads)


def load_gguf_model(
    gguf_file: str | os.PathLike[str] | GgufHeader,
    options: LoadOptions = DEFAULT_LOAD_OPTIONS,
) -> CausalLM:
    """Build the model in ``gguf_file`` (a path, or its already-read header), its weights
    dequantized and then cast to ``dtype`` (or quantized to int8 per row, with
    ``quantization``), with a progress bar on a terminal."""
    header = gguf_file if isinstance(gguf_file, GgufHeader) else read_gguf_header(gguf_file)
    config = model_config_from_gguf_header(header)
    num_tensors = sum(tensor.name not in SKIPPED_GGUF_TENSORS for tensor in header.tensors)
    with load_progress(
        num_tensors, f"Loading {Path(header.path).name}", on_progress=options.on_progress
    ) as advance:
        return build_model(
            config,
            iter_gguf_checkpoint(
                header, config, advance, q4_1_blocks=options.quantization == Quantization.Q4
            ),
            options,
        )


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    llama.cpp stores each head's rows as interleaved pairs ``(head_dim/2, 2)`` where Hugging Face
    keeps the two rotary halves ``(2, head_dim/2)``; ``weight`` is ``(num_heads * head_dim, ...)``.
    """
    num_rows = weight.shape[0]
    if num_rows % (2 * num_heads):
        raise ValueError(f"{num_rows} rows do not split into {num_heads} heads of even size")
    half_head_dim = num_rows // num_heads // 2
    # (heads, head_dim/2, 2, ...) -> (heads, 2, head_dim/2, ...)
    pairs = weight.reshape(num_heads, half_head_dim, 2, *weight.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2)).reshape(weight.shape)


def _plan(header: GgufHeader, config: ModelConfig) -> list[_PlannedTensor]:
    file_bytes = Path(header.path).stat().st_size
    architecture = header.architecture or config.model_type
    names = planned_architecture(config).gguf_names
    if names is None:
        raise CheckpointError(
            f"{header.source}: model_type {config.model_type!r} has no GGUF names"
        )
    heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads}
    plan = []
    for info in header.tensors:
        try:
            hf_name = names.checkpoint_name(info.name)
        except UnknownGgufTensorError as exc:
            raise CheckpointError(f"{header.source}: {exc} (architecture {architecture})") from exc
        if hf_name is None:
            continue
        if info.ggml_type not in SUPPORTED_GGML_TYPES:
            raise CheckpointError(
                f"{header.source}: tensor {info.name!r} has type {info.ggml_type}, which is not "
                f"supported (supported: {', '.join(SUPPORTED_GGML_TYPES)})"
            )
        if info.data_offset + info.num_bytes > file_bytes:
            raise CheckpointError(
                f"{header.source}: truncated; tensor {info.name!r} ends at byte "
                f"{info.data_offset + info.num_bytes} of a {file_bytes}-byte file"
            )
        permuted = names.permuted_projection(info.name)
        plan.append(
            _PlannedTensor(
                info=info,
                hf_name=hf_name,
                ggml_type=gguf.GGMLQuantizationType[info.ggml_type],
                num_permuted_heads=None if permuted is None else heads[permuted],
                stored_shift=names.stored_shift(info.name),
                split_role=names.split_role(info.name),
                is_transposed=names.is_transposed(info.name),
                is_negated_exp=names.is_negated_exp(info.name),
                is_squeezed=names.is_squeezed(info.name),
            )
        )
    _check_one_source_each(header, plan)
    return plan


def _check_one_source_each(header: GgufHeader, plan: list[_PlannedTensor]) -> None:
    """Every checkpoint name comes from one tensor, or from both parts of a split one."""
    sources: dict[str, list[_PlannedTensor]] = {}
    for tensor in plan:
        sources.setdefault(tensor.hf_name, []).append(tensor)
    for hf_name, tensors in sources.items():
        roles = sorted(str(tensor.split_role) for tensor in tensors)
        if roles in (["None"], ["k_b", "v_b"], ["gate", "up"], ["qkv", "z"]):
            continue
        names = ", ".join(tensor.info.name for tensor in tensors)
        raise CheckpointError(
            f"{header.source}: {hf_name!r} comes from {names}; it needs one whole tensor or "
            "both parts of llama.cpp's split (attn_k_b and attn_v_b, the experts' gate "
            "and up, or attn_qkv and attn_gate)"
        )


def _read_tensors(
    path: str,
    plan: list[_PlannedTensor],
    on_tensor: Callable[[int], None],
    q4_1_blocks: bool,
    num_key_heads: int | None,
) -> Iterator[tuple[str, torch.Tensor | Q4_1Blocks]]:
    try:
        file_data = np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise CheckpointError(f"GGUF file at {path}: cannot be read ({exc})") from exc
    halves: dict[str, dict[SplitRole, np.ndarray]] = {}
    for tensor in plan:
        if tensor.split_role is None:
            yield tensor.hf_name, _read_tensor(path, file_data, tensor, q4_1_blocks)
        else:
            pair = halves.setdefault(tensor.hf_name, {})
            pair[tensor.split_role] = _read_values(path, file_data, tensor)
            if len(pair) == 2:
                del halves[tensor.hf_name]
                yield tensor.hf_name, _joined(path, tensor.hf_name, pair, num_key_heads)
        on_tensor(1)


def _joined(
    path: str, hf_name: str, pair: dict[SplitRole, np.ndarray], num_key_heads: int | None
) -> torch.Tensor:
    try:
        return torch.from_numpy(join_split_tensor(pair, num_key_heads=num_key_heads))
    except ValueError as exc:
        raise CheckpointError(f"GGUF file at {path}: {hf_name!r}: {exc}") from exc


def _read_tensor(
    path: str, file_data: np.ndarray, tensor: _PlannedTensor, q4_1_blocks: bool
) -> torch.Tensor | Q4_1Blocks:
    blocks = _stored_blocks(path, file_data, tensor)
    is_q4_1_matrix = tensor.ggml_type == gguf.GGMLQuantizationType.Q4_1 and blocks.ndim == 2
    is_as_stored = not (
        tensor.stored_shift or tensor.is_transposed or tensor.is_negated_exp or tensor.is_squeezed
    )
    if q4_1_blocks and is_q4_1_matrix and is_as_stored:
        if tensor.num_permuted_heads is not None:
            blocks = unpermute_rotary_rows(blocks, tensor.num_permuted_heads)
        return Q4_1Blocks(np.asarray(blocks))
    return torch.from_numpy(_values(blocks, tensor))


def _read_values(path: str, file_data: np.ndarray, tensor: _PlannedTensor) -> np.ndarray:
    return _values(_stored_blocks(path, file_data, tensor), tensor)


def _stored_blocks(path: str, file_data: np.ndarray, tensor: _PlannedTensor) -> np.ndarray:
    """The tensor's bytes, one row of blocks per row of values."""
    info = tensor.info
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor.ggml_type]
    row_length = info.shape[-1]
    if row_length % block_size:
        raise CheckpointError(
            f"GGUF file at {path}: tensor {info.name!r} rows of {row_length} values are not whole "
            f"{info.ggml_type} blocks of {block_size}"
        )
    raw = file_data[info.data_offset : info.data_offset + info.num_bytes]
    return raw.reshape(*info.shape[:-1], row_length // block_size * block_bytes)


def _values(blocks: np.ndarray, tensor: _PlannedTensor) -> np.ndarray:
    """Float32 values, dequantized, unpermuted, unshifted, untransposed and unsqueezed, in
    writable memory."""
    values = dequantize(np.asarray(blocks), tensor.ggml_type)
    if tensor.is_squeezed:
        # (channels, 1, kernel) from (channels, kernel) or (1, channels, 1, kernel)
        values = values.reshape(-1, 1, values.shape[-1])
    if tensor.is_negated_exp:
        if not bool((values < 0).all()):
            raise CheckpointError(
                f"tensor {tensor.info.name!r} must hold -exp(x), all negative; it does not"
            )
        # float64 so that only the stored rounding remains
        values = np.log(-values.astype(np.float64)).astype(np.float32)
    if tensor.is_transposed:
        values = np.ascontiguousarray(values.swapaxes(-1, -2))
    if tensor.num_permuted_heads is not None:
        values = unpermute_rotary_rows(values, tensor.num_permuted_heads)
    if tensor.stored_shift:
        values = values - np.float32(tensor.stored_shift)
    if not values.flags.writeable:
        # F32 comes back as a view of the read-only file mapping.
        values = values.copy()
    return values
