"""A llama.cpp mmproj GGUF (architecture ``clip``) beside a text GGUF -> the image model's config.

llama.cpp's converter writes an image model as two files: the text stack (``gemma3``,
``qwen2vl``) and, with ``--mmproj``, the vision tower and projector (``MmprojModel`` and its
subclasses ``Gemma3VisionModel``, ``Qwen2VLVisionModel``). What the mmproj does not hold is
taken as llama.cpp's ``clip.cpp`` takes it:

- gemma3: the pooling factor is ``clip.vision.projector.scale_factor``, else 4 (every Gemma 3
  size); the tower's GELU is the tanh one (``clip.use_gelu``);
- qwen2.5vl: the merge size is ``clip.vision.spatial_merge_size``, else 2; the window blocks
  come from ``clip.vision.n_wa_pattern`` (every n-th block attends to the whole frame); the
  window is ``clip.vision.window_size``, else clip.cpp's fixed 112 pixels; the tower's RoPE
  base is clip.cpp's 10000; a patch is two frames (the converter splits the Conv3D in two).

Neither file holds the prompt's image token ids: they are looked up by their text in the text
GGUF's vocabulary (``tokenizer.ggml.tokens``), as the chat templates write them.
"""

from __future__ import annotations

import attrs

from metrale_config.errors import ConfigError
from metrale_config.fields import FieldReader
from metrale_config.gguf.header import ARCHITECTURE_KEY, GgufHeader
from metrale_config.model_config import ModelConfig, VisionConfig
from metrale_config.siglip_vision import SiglipVisionConfig
from metrale_config.validation import validate_model_config

MMPROJ_ARCHITECTURE = "clip"
PROJECTOR_TYPE_KEY = "clip.projector_type"
PROJECTION_DIM_KEY = "clip.vision.projection_dim"
GEMMA3_PROJECTOR = "gemma3"
QWEN2_5_VL_PROJECTOR = "qwen2.5vl_merger"
# The text GGUF's architecture -> the projector its mmproj must hold.
PROJECTOR_OF_TEXT_ARCHITECTURE = {"gemma3": GEMMA3_PROJECTOR, "qwen2vl": QWEN2_5_VL_PROJECTOR}
# clip.cpp's values where the mmproj holds none.
GEMMA3_DEFAULT_POOL_SIZE = 4
QWEN2_5_VL_DEFAULT_MERGE_SIZE = 2
QWEN2_5_VL_WINDOW_PIXELS = 112
QWEN2_5_VL_ROPE_THETA = 10000.0
QWEN2_5_VL_TEMPORAL_PATCH_SIZE = 2
PATCH_EMBEDDING = "v.patch_embd.weight"
# The second frame's half of Qwen2.5-VL's Conv3D patch embedding.
SECOND_FRAME_PATCH_EMBEDDING = "v.patch_embd.weight.1"
GEMMA3_TOKENS = {"image": "<image_soft_token>", "boi": "<start_of_image>", "eoi": "<end_of_image>"}
QWEN2_5_VL_TOKENS = {
    "image": "<|image_pad|>",
    "video": "<|video_pad|>",
    "vision_start": "<|vision_start|>",
    "vision_end": "<|vision_end|>",
}


def model_config_with_mmproj(
    text_config: ModelConfig, text_header: GgufHeader, mmproj: GgufHeader
) -> ModelConfig:
    """``text_config`` (read from ``text_header``) with the tower of the mmproj file whose
    header is ``mmproj``: model type ``gemma3`` or ``qwen2_5_vl``. Raises ``ConfigError``
    naming the mmproj file and its field when it is not an mmproj, holds another projector
    than the text model's, or projects to another width."""
    reader = FieldReader(source=mmproj.source, data=mmproj.fields)
    arch = reader.string(ARCHITECTURE_KEY)
    if arch != MMPROJ_ARCHITECTURE:
        raise reader.error(
            ARCHITECTURE_KEY, f"is '{arch}', not an mmproj's '{MMPROJ_ARCHITECTURE}'"
        )
    if not reader.boolean("clip.has_vision_encoder", False):
        raise reader.error("clip.has_vision_encoder", "must be true (an image tower)")
    text_arch = text_header.architecture or ""
    expected = PROJECTOR_OF_TEXT_ARCHITECTURE.get(text_arch)
    projector = reader.string(PROJECTOR_TYPE_KEY)
    if expected is None:
        raise ConfigError(
            f"{text_header.source}: architecture '{text_arch}' takes no mmproj here (supported: "
            f"{', '.join(PROJECTOR_OF_TEXT_ARCHITECTURE)})"
        )
    if projector != expected:
        raise reader.error(
            PROJECTOR_TYPE_KEY,
            f"is '{projector}'; the text model {text_header.path} ({text_arch}) takes '{expected}'",
        )
    projection_dim = reader.integer(PROJECTION_DIM_KEY)
    if projection_dim != text_config.hidden_size:
        raise reader.error(
            PROJECTION_DIM_KEY,
            f"is {projection_dim}; the text model {text_header.path} is "
            f"{text_config.hidden_size} wide",
        )
    vocab = _Vocabulary(text_header)
    if projector == GEMMA3_PROJECTOR:
        config = attrs.evolve(
            text_config, model_type="gemma3", siglip_vision=_siglip(reader, mmproj, vocab)
        )
    else:
        config = attrs.evolve(text_config, vision=_qwen2_5_vl_tower(reader, mmproj, vocab))
    validate_model_config(config)
    return config


@attrs.frozen
class _Vocabulary:
    header: GgufHeader

    def token_id(self, text: str) -> int | None:
        tokens = self.header.fields.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise ConfigError(
                f"{self.header.source}: field 'tokenizer.ggml.tokens' is missing; an mmproj "
                f"needs the vocabulary to find the image token {text!r}"
            )
        try:
            return tokens.index(text)
        except ValueError:
            return None

    def required_id(self, text: str) -> int:
        token_id = self.token_id(text)
        if token_id is None:
            raise ConfigError(
                f"{self.header.source}: field 'tokenizer.ggml.tokens' has no {text!r} (the "
                "image token an mmproj's images take)"
            )
        return token_id


def _num_channels(mmproj: GgufHeader) -> int:
    patch = mmproj.tensor(PATCH_EMBEDDING)
    if patch is None or len(patch.shape) != 4:
        raise ConfigError(f"{mmproj.source}: tensor {PATCH_EMBEDDING!r} (4-D) is missing")
    return patch.shape[1]


def _siglip(reader: FieldReader, mmproj: GgufHeader, vocab: _Vocabulary) -> SiglipVisionConfig:
    image_size = reader.positive_integer("clip.vision.image_size")
    patch_size = reader.positive_integer("clip.vision.patch_size")
    if image_size % patch_size:
        raise reader.error(
            "clip.vision.image_size", f"({image_size}) must be a multiple of patch_size"
        )
    if not reader.boolean("clip.use_gelu", True):
        raise reader.error("clip.use_gelu", "must be true (SigLIP's GELU)")
    pool_size = reader.positive_integer(
        "clip.vision.projector.scale_factor", GEMMA3_DEFAULT_POOL_SIZE
    )
    patches = image_size // patch_size
    if patches % pool_size:
        raise reader.error(
            "clip.vision.projector.scale_factor",
            f"({pool_size}) must divide the {patches} patches a side of an image",
        )
    return SiglipVisionConfig(
        num_hidden_layers=reader.positive_integer("clip.vision.block_count"),
        hidden_size=reader.positive_integer("clip.vision.embedding_length"),
        intermediate_size=reader.positive_integer("clip.vision.feed_forward_length"),
        num_attention_heads=reader.positive_integer("clip.vision.attention.head_count"),
        num_channels=_num_channels(mmproj),
        image_size=image_size,
        patch_size=patch_size,
        layer_norm_eps=reader.number("clip.vision.attention.layer_norm_epsilon", 1e-6),
        mm_tokens_per_image=(patches // pool_size) ** 2,
        image_token_id=vocab.required_id(GEMMA3_TOKENS["image"]),
        boi_token_id=vocab.required_id(GEMMA3_TOKENS["boi"]),
        eoi_token_id=vocab.required_id(GEMMA3_TOKENS["eoi"]),
    )


def _qwen2_5_vl_tower(reader: FieldReader, mmproj: GgufHeader, vocab: _Vocabulary) -> VisionConfig:
    if not mmproj.has_tensor(SECOND_FRAME_PATCH_EMBEDDING):
        raise ConfigError(
            f"{mmproj.source}: tensor {SECOND_FRAME_PATCH_EMBEDDING!r} is missing (the second "
            "frame of the patch embedding)"
        )
    if not reader.boolean("clip.use_silu", False):
        raise reader.error("clip.use_silu", "must be true (Qwen2.5-VL's SiLU MLP)")
    depth = reader.positive_integer("clip.vision.block_count")
    period = reader.positive_integer("clip.vision.n_wa_pattern")
    hidden_size = reader.positive_integer("clip.vision.embedding_length")
    merge_size = reader.positive_integer(
        "clip.vision.spatial_merge_size", QWEN2_5_VL_DEFAULT_MERGE_SIZE
    )
    patch_size = reader.positive_integer("clip.vision.patch_size")
    window_size = reader.positive_integer("clip.vision.window_size", QWEN2_5_VL_WINDOW_PIXELS)
    if window_size < patch_size * merge_size:
        raise reader.error(
            "clip.vision.window_size",
            f"({window_size}) must hold a merged patch ({patch_size * merge_size} pixels)",
        )
    return VisionConfig(
        depth=depth,
        hidden_size=hidden_size,
        num_heads=reader.positive_integer("clip.vision.attention.head_count"),
        intermediate_size=reader.positive_integer("clip.vision.feed_forward_length"),
        out_hidden_size=reader.positive_integer(PROJECTION_DIM_KEY),
        projection_intermediate_size=hidden_size * merge_size**2,
        in_channels=_num_channels(mmproj),
        patch_size=patch_size,
        temporal_patch_size=QWEN2_5_VL_TEMPORAL_PATCH_SIZE,
        spatial_merge_size=merge_size,
        hidden_act="silu",
        attention_bias=mmproj.has_tensor("v.blk.0.attn_q.bias"),
        rms_norm_eps=reader.number("clip.vision.attention.layer_norm_epsilon", 1e-6),
        rope_theta=QWEN2_5_VL_ROPE_THETA,
        image_token_id=vocab.required_id(QWEN2_5_VL_TOKENS["image"]),
        video_token_id=vocab.token_id(QWEN2_5_VL_TOKENS["video"]),
        window_size=window_size,
        fullatt_block_indexes=tuple(i for i in range(depth) if (i + 1) % period == 0),
        vision_start_token_id=vocab.token_id(QWEN2_5_VL_TOKENS["vision_start"]),
        vision_end_token_id=vocab.token_id(QWEN2_5_VL_TOKENS["vision_end"]),
    )
