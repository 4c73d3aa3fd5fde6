"""GGUF metadata → ``ModelConfig``: the llama-like architectures (llama, qwen2, qwen3, qwen3moe)
here, the dense families that depart from llama in ``dense_families``, GLM-4.5 in ``glm4_moe``,
DeepSeek-V2 / V3 in ``deepseek2``, gpt-oss in ``gpt_oss``, Qwen3-Next in ``qwen3next``, Kimi Linear
in ``kimi_linear``, Qwen2.5-VL's text stack in ``qwen2vl`` (its tower: ``mmproj``)."""

from __future__ import annotations

import os
import re

from metrale_config.errors import ConfigError
from metrale_config.fields import FieldReader
from metrale_config.gguf.deepseek2 import DEEPSEEK2_ARCHITECTURE, with_deepseek2
from metrale_config.gguf.dense_families import DENSE_GGUF_ARCHITECTURES, with_dense_family
from metrale_config.gguf.glm4_moe import GLM4_MOE_ARCHITECTURE, with_glm4_moe
from metrale_config.gguf.gpt_oss import GPT_OSS_ARCHITECTURE, with_gpt_oss
from metrale_config.gguf.header import ARCHITECTURE_KEY, GgufHeader, read_gguf_header
from metrale_config.gguf.kimi_linear import KIMI_LINEAR_ARCHITECTURE, with_kimi_linear
from metrale_config.gguf.moe import model_type_of, with_moe
from metrale_config.gguf.qwen2vl import QWEN2VL_ARCHITECTURE, QWEN2VL_MODEL_TYPE, with_qwen2vl
from metrale_config.gguf.qwen3next import QWEN3NEXT_ARCHITECTURE, with_qwen3next
from metrale_config.layer_types import LayerType
from metrale_config.model_config import ModelConfig
from metrale_config.rope import RopeScaling
from metrale_config.validation import validate_model_config

SUPPORTED_GGUF_ARCHITECTURES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    *DENSE_GGUF_ARCHITECTURES,
    GLM4_MOE_ARCHITECTURE,
    DEEPSEEK2_ARCHITECTURE,
    GPT_OSS_ARCHITECTURE,
    QWEN3NEXT_ARCHITECTURE,
    KIMI_LINEAR_ARCHITECTURE,
    QWEN2VL_ARCHITECTURE,
)
# GGUF architecture -> model_type where the names differ (MoE variants: ``gguf.moe``).
MODEL_TYPE_OF_ARCHITECTURE = {
    "gemma3": "gemma3_text",
    GLM4_MOE_ARCHITECTURE: "glm4_moe",
    GPT_OSS_ARCHITECTURE: "gpt_oss",
    QWEN3NEXT_ARCHITECTURE: "qwen3_next",
    KIMI_LINEAR_ARCHITECTURE: "kimi_linear",
    QWEN2VL_ARCHITECTURE: QWEN2VL_MODEL_TYPE,
}
# Architectures whose ``attention.head_count_kv`` may list one count per layer (their family
# reader places the layers by it).
PER_LAYER_KV_HEADS_ARCHITECTURES = (KIMI_LINEAR_ARCHITECTURE,)
# NOTE: llama.cpp bakes llama3-style rope scaling into this tensor instead of metadata; the
# config records it as a rope_type no family implements, so a family refuses it rather than
# running with the wrong frequencies.
ROPE_FREQS_TENSOR = "rope_freqs.weight"
GGUF_ROPE_FREQS_TYPE = "gguf_rope_freqs"


def model_config_from_gguf(path: str | os.PathLike[str]) -> ModelConfig:
    """Read the header of the GGUF file ``path`` and parse its metadata."""
    return model_config_from_gguf_header(read_gguf_header(path))


def model_config_from_gguf_header(header: GgufHeader) -> ModelConfig:
    """Raise ``ConfigError`` naming the file for an unsupported architecture or a bad key."""
    reader = FieldReader(source=header.source, data=header.fields)
    arch = reader.string(ARCHITECTURE_KEY)
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ConfigError(
            f"{header.source}: unsupported {ARCHITECTURE_KEY} '{arch}'; "
            f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    hidden_size = reader.integer(f"{arch}.embedding_length")
    num_heads = reader.integer(f"{arch}.attention.head_count")
    if num_heads <= 0:
        raise reader.error(f"{arch}.attention.head_count", f"must be positive, got {num_heads}")
    num_layers = reader.integer(f"{arch}.block_count")
    max_position_embeddings = reader.integer(f"{arch}.context_length")
    config = ModelConfig(
        source=header.source,
        model_type=MODEL_TYPE_OF_ARCHITECTURE.get(arch) or model_type_of(reader, arch),
        vocab_size=_vocab_size(reader, header, arch),
        hidden_size=hidden_size,
        intermediate_size=reader.integer(f"{arch}.feed_forward_length"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=_num_key_value_heads(reader, arch, num_heads),
        head_dim=reader.integer(f"{arch}.attention.key_length", hidden_size // num_heads),
        rms_norm_eps=reader.number(f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=reader.number(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=_rope_scaling(reader, header, arch),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=not header.has_tensor("output.weight"),
        qkv_bias=header.has_tensor("blk.0.attn_q.bias"),
        o_proj_bias=header.has_tensor("blk.0.attn_output.bias"),
        mlp_bias=header.has_tensor("blk.0.ffn_up.bias"),
        qk_norm=header.has_tensor("blk.0.attn_q_norm.weight"),
        bos_token_id=reader.optional_integer("tokenizer.ggml.bos_token_id"),
        eos_token_ids=reader.optional_integer_list("tokenizer.ggml.eos_token_id") or (),
        pad_token_id=reader.optional_integer("tokenizer.ggml.padding_token_id"),
        layer_types=(LayerType.FULL_ATTENTION,) * num_layers,
        quantization_method="gguf",
        gguf_projection_types=_projection_types(header),
    )
    config = with_moe(config, reader, header, arch)
    config = with_dense_family(config, reader, header, arch)
    if arch == GLM4_MOE_ARCHITECTURE:
        config = with_glm4_moe(config, reader, header)
    if arch == DEEPSEEK2_ARCHITECTURE:
        config = with_deepseek2(config, reader, header)
    if arch == GPT_OSS_ARCHITECTURE:
        config = with_gpt_oss(config, reader, header)
    if arch == QWEN3NEXT_ARCHITECTURE:
        config = with_qwen3next(config, reader, header)
    if arch == KIMI_LINEAR_ARCHITECTURE:
        config = with_kimi_linear(config, reader, header)
    if arch == QWEN2VL_ARCHITECTURE:
        config = with_qwen2vl(config, reader, arch)
    validate_model_config(config)
    return config


_PROJECTION = re.compile(r"blk\.\d+\.(attn_(q|k|v|qkv|output)|ffn_(gate|up|down))\.weight")


def _projection_types(header: GgufHeader) -> tuple[str, ...]:
    return tuple(
        sorted({info.ggml_type for info in header.tensors if _PROJECTION.fullmatch(info.name)})
    )


def _num_key_value_heads(reader: FieldReader, arch: str, num_heads: int) -> int:
    """One integer; for ``PER_LAYER_KV_HEADS_ARCHITECTURES`` a per-layer list may stand for its
    largest count (0 on layers without attention: all 0 reads as ``num_heads``)."""
    key = f"{arch}.attention.head_count_kv"
    if arch in PER_LAYER_KV_HEADS_ARCHITECTURES and isinstance(reader.data.get(key), list):
        counts = reader.optional_integer_list(key) or ()
        return max(counts, default=0) or num_heads
    return reader.integer(key, num_heads)


def _vocab_size(reader: FieldReader, header: GgufHeader, arch: str) -> int:
    if reader.has(f"{arch}.vocab_size"):
        return reader.integer(f"{arch}.vocab_size")
    tokens = header.fields.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        return len(tokens)
    embedding = header.tensor("token_embd.weight")
    if embedding is not None:
        return embedding.shape[0]
    raise reader.error(f"{arch}.vocab_size", "is missing (and there is no tokenizer.ggml.tokens)")


def _rope_scaling(reader: FieldReader, header: GgufHeader, arch: str) -> RopeScaling | None:
    if header.has_tensor(ROPE_FREQS_TENSOR):
        return RopeScaling(rope_type=GGUF_ROPE_FREQS_TYPE)
    scaling_type = reader.string(f"{arch}.rope.scaling.type", "none")
    if scaling_type == "none":
        linear_factor = reader.optional_number(f"{arch}.rope.scale_linear")
        if linear_factor is None or linear_factor == 1.0:
            return None
        return RopeScaling(rope_type="linear", factor=linear_factor)
    return RopeScaling(
        rope_type=scaling_type,
        factor=reader.number(f"{arch}.rope.scaling.factor", 1.0),
        original_max_position_embeddings=reader.optional_integer(
            f"{arch}.rope.scaling.original_context_length"
        ),
    )
