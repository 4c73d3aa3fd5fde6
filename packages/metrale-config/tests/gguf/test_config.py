"""``model_config_from_gguf`` / ``model_config_from_gguf_header``: the bundled SmolLM2 and
tiny written files."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import (
    FULL_ATTENTION,
    ConfigError,
    GgufHeader,
    RopeScaling,
    model_config_from_gguf,
    model_config_from_gguf_header,
)

# The ``tiny_gguf`` fixture (conftest.py): writes a small GGUF file, returns its path.
TinyGguf = Callable[..., Path]


def test_bundled_smollm2(bundled_gguf_header: GgufHeader, bundled_gguf_path: Path) -> None:
    config = model_config_from_gguf_header(bundled_gguf_header)
    assert config.model_type == "llama"
    assert config.source == f"GGUF file at {bundled_gguf_path}"
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (
        30,
        576,
        1536,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert (config.rope_theta, config.rope_scaling) == (100000.0, None)
    assert (config.max_position_embeddings, config.vocab_size) == (8192, 49152)
    assert config.rms_norm_eps == 1e-5
    assert config.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_ids, config.pad_token_id) == (1, (2,), 2)
    assert (config.qkv_bias, config.qk_norm) == (False, False)
    assert config.layer_types == (FULL_ATTENTION,) * 30
    assert config.quantization_method == "gguf"


def test_from_gguf_reads_the_file(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf())
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (2, 32, 8)
    assert config.vocab_size == 40
    assert config.rope_theta == 1000000.0


def test_output_tensor_means_untied(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf(tensors={"output.weight": (40, 32)}))
    assert config.tie_word_embeddings is False


def test_qwen3_key_length_and_qk_norm(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf("qwen3", attention__key_length=16, tensors={"blk.0.attn_q_norm.weight": (16,)})
    config = model_config_from_gguf(path)
    assert config.model_type == "qwen3"
    assert (config.head_dim, config.qk_norm, config.qkv_bias) == (16, True, False)


def test_qwen2_qkv_bias_from_tensors(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf("qwen2", tensors={"blk.0.attn_q.bias": (32,)}))
    assert (config.qkv_bias, config.o_proj_bias) == (True, False)


def test_rope_scaling_keys(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(
        rope__scaling__type="yarn",
        rope__scaling__factor=4.0,
        rope__scaling__original_context_length=64,
    )
    assert model_config_from_gguf(path).rope_scaling == RopeScaling(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=64
    )


def test_rope_freqs_tensor_is_marked_for_families_to_refuse(tiny_gguf: TinyGguf) -> None:
    config = model_config_from_gguf(tiny_gguf(tensors={"rope_freqs.weight": (4,)}))
    assert config.rope_scaling is not None
    assert config.rope_scaling.rope_type == "gguf_rope_freqs"


def test_missing_key_names_it_and_the_file(tiny_gguf: TinyGguf) -> None:
    path = tiny_gguf(skip=("block_count",))
    with pytest.raises(
        ConfigError, match=re.escape(f"GGUF file at {path}: field 'llama.block_count' is missing")
    ):
        model_config_from_gguf(path)


def test_unsupported_architecture(tiny_gguf: TinyGguf) -> None:
    with pytest.raises(ConfigError, match=r"unsupported general\.architecture 'gpt2'; supported"):
        model_config_from_gguf(tiny_gguf("gpt2"))


def test_mistyped_key(tiny_gguf: TinyGguf) -> None:
    with pytest.raises(
        ConfigError, match=r"field 'llama\.block_count' must be an integer, got str"
    ):
        model_config_from_gguf(tiny_gguf(block_count="two"))
