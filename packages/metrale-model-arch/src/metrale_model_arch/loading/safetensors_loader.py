"""Read a Hugging Face safetensors checkpoint (single file or sharded) into a model.

Only the safetensors format is read: never pickle, never ``torch.load``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from metrale_config import ModelConfig
from metrale_model_arch.build import build_model
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.fp8_rows import Fp8Rows
from metrale_model_arch.int4_format import int4_support_error
from metrale_model_arch.load_options import DEFAULT_LOAD_OPTIONS, LoadOptions
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.fp8_checkpoints import fp8_checkpoint_tensors
from metrale_model_arch.loading.int4_checkpoints import int4_checkpoint_tensors
from metrale_model_arch.loading.mxfp4_checkpoints import MXFP4, mxfp4_checkpoint_tensors
from metrale_model_arch.loading.progress import load_progress
from metrale_model_arch.parallel.checkpoint_shard import CheckpointSharder, ShardSlice
from metrale_model_arch.q4_1_blocks import Q4_1Blocks
from metrale_model_arch.weight_format import Quantization

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MODEL_PREFIX = "model."
BASE_MODEL_MARKER = "embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def checkpoint_tensor_names(model_dir: str | Path) -> dict[Path, list[str]]:
    """Each checkpoint file's tensor names, read from the headers alone, in load order.

    The checkpoint is ``model.safetensors``, else the shards ``model.safetensors.index.json``
    names. Raises :class:`CheckpointError` naming the absent index or shards, an unreadable
    file, or a tensor the index promises that its shard lacks.
    """
    model_dir = Path(model_dir)
    if (model_dir / SINGLE_FILE).is_file():
        return _read_headers([model_dir / SINGLE_FILE])
    index_path = model_dir / INDEX_FILE
    if not index_path.is_file():
        raise CheckpointError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} is there")
    weight_map = _weight_map(index_path)
    shards = sorted(set(weight_map.values()))
    absent = [shard for shard in shards if not (model_dir / shard).is_file()]
    if absent:
        raise CheckpointError(f"{index_path} names missing shard file(s): {', '.join(absent)}")
    names = _read_headers([model_dir / shard for shard in shards])
    in_shard = {path.name: set(file_names) for path, file_names in names.items()}
    lacking = [
        f"{name} ({shard})" for name, shard in weight_map.items() if name not in in_shard[shard]
    ]
    if lacking:
        raise CheckpointError(f"{index_path} lists tensors its shards lack: {', '.join(lacking)}")
    return names


def is_base_model_checkpoint(names: dict[Path, list[str]]) -> bool:
    """Whether the checkpoint holds a base model alone, as transformers' ``AutoModel`` saves
    it (Qwen3-Embedding: ``embed_tokens.weight``, ``layers.0...``, no ``model.`` prefix); the
    family's checkpoint mapping names its tensors as the causal LM's."""
    all_names = [name for file_names in names.values() for name in file_names]
    return BASE_MODEL_MARKER in all_names and not any(
        name.startswith(MODEL_PREFIX) for name in all_names
    )


def iter_safetensors(
    names: dict[Path, list[str]],
    on_tensor: Callable[[int], None] = lambda n: None,
    slice_of: Callable[[str], ShardSlice | None] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` file by file, on the CPU in the file's dtype; with
    ``slice_of``, only the part of each tensor it names, read alone (one rank's shard)."""
    for path, file_names in names.items():
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in file_names:
                    part = ShardSlice(name) if slice_of is None else slice_of(name)
                    if part is not None and part.index:
                        yield part.name, handle.get_slice(name)[part.index]
                    elif part is not None:
                        yield part.name, handle.get_tensor(name)
                    on_tensor(1)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


def load_safetensors_model(
    model_dir: str | Path,
    config: ModelConfig,
    options: LoadOptions = DEFAULT_LOAD_OPTIONS,
) -> CausalLM:
    """Build ``config``'s model from the safetensors checkpoint in ``model_dir``: a causal
    LM's, or its base model's alone (:func:`is_base_model_checkpoint`) when the head is tied."""
    if (error := quantized_checkpoint_error(config, options)) is not None:
        raise CheckpointError(f"{model_dir}: {error}")
    names = checkpoint_tensor_names(model_dir)
    has_head = any(LM_HEAD in file_names for file_names in names.values())
    if is_base_model_checkpoint(names) and not has_head and not config.tie_word_embeddings:
        raise CheckpointError(
            f"{model_dir}: the checkpoint holds the base model alone, without {LM_HEAD} (as "
            "transformers' AutoModel saves an embedding model), and config.json sets "
            "tie_word_embeddings false: the model has no head to load. An embedding model "
            "needs none: load it without one (LoadOptions(without_head=True), as "
            "`met serve --task embed` does)"
        )
    total = sum(len(file_names) for file_names in names.values())
    shard = options.shard
    is_split = shard is not None and shard.world_size > 1
    slice_of = CheckpointSharder(config, shard).slice_of if is_split and shard else None
    with load_progress(
        total, f"Loading {Path(model_dir).name}", on_progress=options.on_progress
    ) as advance:
        return build_model(
            config,
            checkpoint_tensors(
                iter_safetensors(names, advance, slice_of),
                config,
                keep_fp8=options.quantization == Quantization.FP8,
            ),
            options,
            is_sharded=slice_of is not None,
        )


def checkpoint_tensors(
    read: Iterable[tuple[str, torch.Tensor]], config: ModelConfig, *, keep_fp8: bool = False
) -> Iterable[tuple[str, torch.Tensor | Q4_1Blocks | Fp8Rows]]:
    """The tensors ``read`` as the model takes them: an int4 checkpoint's projections as
    blocks, an fp8 or mxfp4 checkpoint's weights dequantized (``keep_fp8``: an fp8 weight
    scaled per tensor or channel kept as stored), any other checkpoint's as stored."""
    if config.int4_quantization is not None:
        return int4_checkpoint_tensors(read, config)
    if config.fp8_quantization is not None:
        return fp8_checkpoint_tensors(read, config, keep_fp8=keep_fp8)
    if config.quantization_method == MXFP4:
        return mxfp4_checkpoint_tensors(read)
    return read


def quantized_checkpoint_error(config: ModelConfig, options: LoadOptions) -> str | None:
    """Why ``config``'s ``quantization_config`` cannot be loaded with ``options``, or None: AWQ
    and GPTQ int4 (:mod:`~metrale_model_arch.loading.int4_checkpoints`), FP8 e4m3
    (:mod:`~metrale_model_arch.loading.fp8_checkpoints`) and gpt-oss's MXFP4
    (:mod:`~metrale_model_arch.loading.mxfp4_checkpoints`) are read, on one rank."""
    if config.quantization_method is None:
        return None
    if config.quantization_method == MXFP4:
        if config.model_type != "gpt_oss":
            return f"mxfp4 checkpoints are read for gpt_oss only, not {config.model_type}"
        return None
    if config.fp8_quantization is not None:
        if options.shard is not None and options.shard.world_size > 1:
            return "fp8 checkpoints are not split across ranks yet"
        return None
    if config.int4_quantization is None:
        return (
            f"quantization_config.quant_method {config.quantization_method!r} is not supported "
            "for safetensors checkpoints (supported: awq, gptq, fp8, compressed-tensors fp8, mxfp4)"
        )
    if (error := int4_support_error(config)) is not None:
        return error
    if options.shard is not None and options.shard.world_size > 1:
        return f"{config.int4_quantization.method} int4 checkpoints are not split across ranks yet"
    return None


def _weight_map(index_path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_path}: not a safetensors index ({exc!r})") from exc
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(f"{index_path}: weight_map must map tensor names to file names")
    return weight_map


def _read_headers(files: list[Path]) -> dict[Path, list[str]]:
    names: dict[Path, list[str]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                names[path] = list(handle.keys())
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
    return names
