"""A saved transformers image checkpoint (gemma3, qwen2_5_vl) -> the two GGUFs llama.cpp's
``convert_hf_to_gguf.py`` writes for it: the text stack (without ``--mmproj``, through
:func:`metrale_testing.llama_cpp_gguf.convert_to_gguf`) and the mmproj (with ``--mmproj``).

The mmproj is written from ``MmprojModel`` and its subclasses ``Gemma3VisionModel`` and
``Qwen2VLVisionModel``, and gguf-py's ``MODEL_ARCH.MMPROJ`` tensor map: architecture ``clip``,
``general.type`` ``mmproj``, the ``clip.vision.*`` keys (``image_size`` 560 for Qwen2.5-VL,
whose config has none; Gemma 3's ``projector.scale_factor`` only when it is not 4, derived from
the preprocessor's ``image_seq_length``), Gemma 3's ``soft_emb_norm`` stored ``+ 1``, Qwen's
fused ``qkv`` split in three and its Conv3D patch embedding split into its two frames. Types as
the converter's ``tensor_force_quant``: patch embeddings F32 (F16 in an F16 file), Gemma 3's
embeddings F32 and ``input_projection`` F16; the rest as the text GGUF's tensors.

transformers 5 saves ``vision_tower.*`` / ``model.visual.*``; the names are first put in the
published checkpoints' layout (``vision_tower.vision_model.*``, ``visual.*``), which is what
the converter's tensor map knows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file, save_file

from metrale_testing.llama_cpp_gguf import _FILE_TYPES, Vocabulary, _add_tensor, convert_to_gguf

Q = gguf.GGMLQuantizationType
# The image model's model type -> its text stack's, as the text GGUF converts it.
TEXT_MODEL_TYPE = {"gemma3": "gemma3_text", "qwen2_5_vl": "qwen2_5_vl"}
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "visual.")
QWEN2_5_VL_DEFAULT_IMAGE_SIZE = 560
GEMMA3_DEFAULT_SCALE_FACTOR = 4
# Qwen2.5-VL's merger is ``mm.0`` and ``mm.2``.
MIN_MAP_BLOCKS = 3


def convert_image_model(
    checkpoint_dir: Path, out_dir: Path, qtype: Q, vocab: Vocabulary
) -> tuple[Path, Path]:
    """The text GGUF and the mmproj GGUF of ``checkpoint_dir``, written into ``out_dir`` (as a
    llama.cpp user lays them out: ``model-<type>.gguf`` beside ``mmproj-model-<type>.gguf``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = qtype.name.lower()
    text_dir = text_checkpoint(checkpoint_dir, out_dir / "text-checkpoint")
    text = convert_to_gguf(text_dir, out_dir / f"model-{suffix}.gguf", qtype, vocab=vocab)
    mmproj = write_mmproj(checkpoint_dir, out_dir / f"mmproj-model-{suffix}.gguf", qtype)
    return text, mmproj


def text_checkpoint(checkpoint_dir: Path, out_dir: Path) -> Path:
    """The text stack as the converter's ``TextModel`` sees it: ``text_config`` lifted to the
    top level, the language model's tensors under ``model.`` (the tower's dropped)."""
    hparams = _config(checkpoint_dir)
    text = {**hparams, **hparams.get("text_config", {})}
    text["model_type"] = TEXT_MODEL_TYPE[hparams["model_type"]]
    text.pop("text_config", None)
    text.pop("vision_config", None)
    tensors = {}
    for name, data in _tensors(checkpoint_dir):
        if name.startswith(_TEXT_PREFIXES):
            tensors["model." + name.split(".", 2)[2]] = data
        elif not _is_vision(name):
            tensors[name.removeprefix("language_model.")] = data
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(text), encoding="utf-8")
    save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def write_mmproj(checkpoint_dir: Path, out_path: Path, qtype: Q) -> Path:
    """The mmproj llama.cpp's converter writes for ``checkpoint_dir`` with ``--mmproj
    --outtype`` ``qtype``."""
    hparams = _config(checkpoint_dir)
    preprocessor = json.loads(
        (checkpoint_dir / "preprocessor_config.json").read_text(encoding="utf-8")
    )
    model_type = hparams["model_type"]
    vision = dict(hparams["vision_config"])
    text = {**hparams, **hparams.get("text_config", {})}
    if model_type == "qwen2_5_vl":
        vision.setdefault("image_size", QWEN2_5_VL_DEFAULT_IMAGE_SIZE)
        vision["num_attention_heads"] = vision["num_heads"]
        vision["num_hidden_layers"] = vision["depth"]
    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(_FILE_TYPES[qtype])
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text["hidden_size"])
    writer.add_vision_image_size(vision["image_size"])
    writer.add_vision_patch_size(vision["patch_size"])
    writer.add_vision_embedding_length(vision["hidden_size"])
    writer.add_vision_feed_forward_length(vision["intermediate_size"])
    writer.add_vision_block_count(vision["num_hidden_layers"])
    writer.add_vision_head_count(vision["num_attention_heads"])
    writer.add_vision_image_mean(preprocessor["image_mean"])
    writer.add_vision_image_std(preprocessor["image_std"])
    if model_type == "gemma3":
        _gemma3_metadata(writer, vision, preprocessor)
    else:
        _qwen2_5_vl_metadata(writer, vision, hparams)
    # The map's ``mm.{bid}`` names stop at the block count: a 2-block tower still needs mm.2.
    num_map_blocks = max(vision["num_hidden_layers"], MIN_MAP_BLOCKS)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, num_map_blocks)
    for name, data in _vision_tensors(checkpoint_dir, model_type):
        gguf_name = _gguf_name(name_map, name)
        forced = _forced_type(model_type, name, gguf_name, qtype)
        data = data.astype(np.float32)
        if forced is None:
            _add_tensor(writer, gguf_name, data, qtype)
        elif forced == Q.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _gemma3_metadata(
    writer: gguf.GGUFWriter, vision: dict[str, Any], preprocessor: dict[str, Any]
) -> None:
    """``Gemma3VisionModel.set_gguf_parameters``."""
    writer.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    writer.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    per_side = int(preprocessor.get("image_seq_length", 256) ** 0.5)
    scale_factor = (vision["image_size"] // vision["patch_size"]) // per_side
    if scale_factor > 0 and scale_factor != GEMMA3_DEFAULT_SCALE_FACTOR:
        writer.add_vision_projector_scale_factor(scale_factor)


def _qwen2_5_vl_metadata(
    writer: gguf.GGUFWriter, vision: dict[str, Any], hparams: dict[str, Any]
) -> None:
    """``Qwen2VLVisionModel.set_gguf_parameters`` for ``qwen2_5_vl``."""
    writer.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
    writer.add_vision_use_silu(True)
    full_blocks = vision["fullatt_block_indexes"]
    period = full_blocks[0] + 1
    if any(b - a != period for a, b in pairwise(full_blocks)):
        raise ValueError(f"Invalid fullatt_block_indexes: {full_blocks}")
    writer.add_vision_n_wa_pattern(period)
    writer.add_vision_attention_layernorm_eps(hparams.get("rms_norm_eps", 1e-6))


def _vision_tensors(checkpoint_dir: Path, model_type: str) -> Iterator[tuple[str, np.ndarray]]:
    """The tower's and projector's tensors in the published layout, as the converter's
    ``modify_tensors`` hands them on (split, shifted, renamed)."""
    for name, data in _tensors(checkpoint_dir):
        if not _is_vision(name):
            continue
        name = name.removeprefix("model.")
        if model_type == "gemma3":
            if name.startswith("vision_tower.") and ".vision_model." not in f".{name}":
                name = "vision_tower.vision_model." + name.removeprefix("vision_tower.")
            if "vision_model.head." in name:
                continue
            name = name.replace("_weight", ".weight")
            if "soft_emb_norm.weight" in name:
                data = data.astype(np.float32) + np.float32(1)
            yield name, data
        elif ".qkv." in name:
            for part, third in zip("qkv", np.split(data, 3), strict=True):
                yield name.replace("qkv", part), third
        elif "patch_embed.proj.weight" in name:
            # (out, channels, 2, patch, patch) -> one (out, channels, patch, patch) per frame
            assert data.shape[2] == 2, "the converter only splits a temporal patch of 2"
            yield "v.patch_embd.weight", data[:, :, 0]
            yield "v.patch_embd.weight.1", data[:, :, 1]
        else:
            yield name, data


def _gguf_name(name_map: gguf.TensorNameMap, name: str) -> str:
    if name.startswith("v.patch_embd."):
        return name
    gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
    if gguf_name is None:
        raise ValueError(f"{name} has no llama.cpp mmproj name")
    return gguf_name


def _forced_type(model_type: str, name: str, gguf_name: str, qtype: Q) -> Q | None:
    """``tensor_force_quant`` (the subclass's, then ``MmprojModel``'s); ``None``: the usual
    rules."""
    if model_type == "gemma3":
        if "input_projection" in name:
            return Q.F16
        if ".embeddings." in name:
            return Q.F32
    if ".patch_embd.weight" in gguf_name:
        return Q.F16 if qtype == Q.F16 else Q.F32
    return None


def _is_vision(name: str) -> bool:
    return name.removeprefix("model.").startswith(_VISION_PREFIXES)


def _config(checkpoint_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(
        (checkpoint_dir / "config.json").read_text(encoding="utf-8")
    )
    return config


def _tensors(checkpoint_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    for file in sorted(checkpoint_dir.glob("*.safetensors")):
        yield from load_file(file).items()


def vocabulary(vocab_size: int, named: dict[int, str], **special_ids: int | None) -> Vocabulary:
    """``vocab_size`` tokens, ``named`` ones (an image model's image tokens, control tokens) by
    their text and the rest ``<tok_i>``; ``special_ids``: ``bos_token_id`` / ``eos_token_id`` /
    ``pad_token_id``."""
    plain = {3: "a", 4: "b", 5: "ab"}  # one merge: a gguf-py writes no empty list of merges
    tokens = tuple(named.get(i, plain.get(i, f"<tok_{i}>")) for i in range(vocab_size))
    return Vocabulary(
        tokens=tokens, merges=("a b",), control_token_ids=frozenset(named), **special_ids
    )
