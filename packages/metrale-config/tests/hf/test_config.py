"""``model_config_from_hf_file`` on configs that transformers itself saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers

from metrale_config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    SLIDING_ATTENTION,
    SPARSE_ATTENTION,
    RopeScaling,
    model_config_from_hf_dict,
    model_config_from_hf_file,
)

TINY: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


def _saved(tmp_path: Path, config: Any) -> Path:
    config.save_pretrained(tmp_path)
    return tmp_path


def _config_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path / "config.json").read_text())
    return data


def test_llama_fields(tmp_path: Path) -> None:
    hf = transformers.LlamaConfig(
        **TINY, attention_bias=True, mlp_bias=True, tie_word_embeddings=True, eos_token_id=[2, 7]
    )
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.model_type == "llama"
    assert config.source == f"config.json at {tmp_path / 'config.json'}"
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (320, 64, 160)
    assert (config.num_hidden_layers, config.num_attention_heads) == (4, 8)
    assert (config.num_key_value_heads, config.head_dim, config.num_queries_per_kv) == (2, 8, 4)
    assert (config.qkv_bias, config.o_proj_bias, config.mlp_bias) == (True, True, True)
    assert config.qk_norm is False
    assert config.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2, 7))
    assert (config.max_position_embeddings, config.rms_norm_eps) == (2048, 1e-6)
    assert (config.rope_theta, config.rope_scaling) == (10000.0, None)
    assert config.layer_types == (FULL_ATTENTION,) * 4
    assert config.sliding_window is None
    assert (config.moe, config.mla, config.dsa, config.linear_attention, config.mtp) == (None,) * 5


def test_config_path_may_be_the_file_or_its_directory(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.LlamaConfig(**TINY))
    assert model_config_from_hf_file(tmp_path / "config.json") == model_config_from_hf_file(
        str(tmp_path)
    )


def test_llama3_rope_parameters(tmp_path: Path) -> None:
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    hf = transformers.LlamaConfig(**TINY, rope_parameters=rope, max_position_embeddings=4096)
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert "rope_parameters" in _config_json(tmp_path)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=1024,
    )


def test_legacy_rope_theta_and_rope_scaling(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.LlamaConfig(**TINY))
    data = _config_json(tmp_path)
    del data["rope_parameters"]
    data["rope_theta"] = 250000.0
    data["rope_scaling"] = {"type": "linear", "factor": 2.0}
    config = model_config_from_hf_dict(data, source="legacy")
    assert config.rope_theta == 250000.0
    assert config.rope_scaling == RopeScaling(rope_type="linear", factor=2.0)


def test_unknown_rope_type_is_kept_for_the_family_to_refuse(tmp_path: Path) -> None:
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    hf = transformers.Qwen2Config(**TINY, rope_parameters=rope)
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.rope_scaling is not None
    assert (config.rope_scaling.rope_type, config.rope_scaling.factor) == ("yarn", 4.0)
    assert config.rope_scaling.original_max_position_embeddings == 32768


def test_mistral_sliding_window_and_biases(tmp_path: Path) -> None:
    hf = transformers.MistralConfig(**TINY, sliding_window=32)
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.model_type == "mistral"
    assert config.sliding_window == 32
    assert config.layer_types == (SLIDING_ATTENTION,) * 4
    assert (config.qkv_bias, config.o_proj_bias, config.mlp_bias) == (False, False, False)
    assert config.max_position_embeddings == 131072


def test_mistral_without_window_is_full_attention(tmp_path: Path) -> None:
    hf = transformers.MistralConfig(**TINY, sliding_window=None)
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert (config.sliding_window, config.layer_types) == (None, (FULL_ATTENTION,) * 4)


def test_qwen2_biases_and_tied_embeddings(tmp_path: Path) -> None:
    hf = transformers.Qwen2Config(**TINY, tie_word_embeddings=True, dtype="bfloat16")
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert (config.qkv_bias, config.o_proj_bias, config.qk_norm) == (True, False, False)
    assert config.head_dim == 8
    assert config.tie_word_embeddings is True
    assert config.torch_dtype == "bfloat16"
    assert config.sliding_window is None


def test_qwen2_sliding_window_follows_max_window_layers(tmp_path: Path) -> None:
    hf = transformers.Qwen2Config(
        **TINY, use_sliding_window=True, sliding_window=16, max_window_layers=2
    )
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.sliding_window == 16
    assert config.layer_types == (FULL_ATTENTION,) * 2 + (SLIDING_ATTENTION,) * 2
    assert list(config.layer_types) == hf.layer_types


def test_qwen2_sliding_window_is_ignored_unless_enabled(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.Qwen2Config(**TINY))
    data = _config_json(tmp_path)
    data["sliding_window"] = 16
    data.pop("layer_types")
    config = model_config_from_hf_dict(data, source="qwen2")
    assert (config.sliding_window, config.layer_types) == (None, (FULL_ATTENTION,) * 4)


def test_qwen3_head_dim_qk_norm_and_attention_bias(tmp_path: Path) -> None:
    hf = transformers.Qwen3Config(**TINY, head_dim=16, attention_bias=True)
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.model_type == "qwen3"
    assert (config.head_dim, config.qk_norm) == (16, True)
    assert (config.qkv_bias, config.o_proj_bias) == (True, True)


def test_head_dim_null_means_hidden_over_heads(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.Qwen3Config(**TINY))
    data = _config_json(tmp_path)
    data["head_dim"] = None
    assert model_config_from_hf_dict(data, source="x").head_dim == 8
    del data["head_dim"]
    assert model_config_from_hf_dict(data, source="x").head_dim == 128


def test_num_key_value_heads_null_means_num_attention_heads(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.LlamaConfig(**TINY))
    data = _config_json(tmp_path)
    data["num_key_value_heads"] = None
    assert model_config_from_hf_dict(data, source="x").num_key_value_heads == 8


def test_qwen3_moe_experts_and_dense_layers(tmp_path: Path) -> None:
    hf = transformers.Qwen3MoeConfig(
        **TINY,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        norm_topk_prob=True,
    )
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.is_moe
    assert config.moe is not None
    assert (config.moe.num_experts, config.moe.num_experts_per_tok) == (6, 2)
    assert (config.moe.moe_intermediate_size, config.moe.norm_topk_prob) == (48, True)
    assert config.moe.mlp_layer_types == ("dense", "sparse", "sparse", "sparse")
    assert config.qk_norm is True
    assert config.intermediate_size == 160


def test_qwen3_moe_reads_num_experts_under_either_name(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.Qwen3MoeConfig(**TINY, num_experts=6, num_experts_per_tok=2))
    data = _config_json(tmp_path)
    data["num_experts"] = data.pop("num_local_experts")
    data["decoder_sparse_step"] = 2
    config = model_config_from_hf_dict(data, source="x")
    assert config.moe is not None
    assert config.moe.num_experts == 6
    assert config.moe.mlp_layer_types == ("dense", "sparse", "dense", "sparse")


def test_mixtral_experts_use_intermediate_size(tmp_path: Path) -> None:
    hf = transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2)
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.moe is not None
    assert (config.moe.num_experts, config.moe.moe_intermediate_size) == (4, 160)
    assert config.moe.mlp_layer_types == ("sparse",) * 4
    assert (config.rope_theta, config.rms_norm_eps) == (1000000.0, 1e-5)


def test_model_type_is_normalized(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.Qwen3MoeConfig(**TINY))
    data = _config_json(tmp_path)
    data["model_type"] = "Qwen3-MoE"
    assert model_config_from_hf_dict(data, source="x").model_type == "qwen3_moe"


def test_mtp_layers_and_quantization_method(tmp_path: Path) -> None:
    _saved(tmp_path, transformers.Qwen3Config(**TINY))
    data = _config_json(tmp_path)
    data["num_nextn_predict_layers"] = 1
    data["quantization_config"] = {"quant_method": "fp8"}
    config = model_config_from_hf_dict(data, source="x")
    assert config.mtp is not None
    assert config.mtp.num_layers == 1
    assert config.quantization_method == "fp8"


@pytest.fixture(scope="module")
def glm5_wrapper_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("glm5_next")
    transformers.Glm5NextConfig().save_pretrained(path)
    return path / "config.json"


def test_glm5_next_defaults_from_the_multimodal_wrapper(glm5_wrapper_json: Path) -> None:
    config = model_config_from_hf_file(glm5_wrapper_json)
    assert config.model_type == "glm5_next"
    assert config.num_hidden_layers == 45
    assert config.num_layers_of_type(SPARSE_ATTENTION) == 11
    assert config.num_layers_of_type(LINEAR_ATTENTION) == 34
    assert config.layer_types[3] == SPARSE_ATTENTION
    assert config.layer_types[0] == LINEAR_ATTENTION
    assert config.mla is not None
    assert config.dsa is not None
    assert (config.mla.kv_lora_rank, config.mla.q_lora_rank, config.mla.qk_rope_head_dim) == (
        512,
        1536,
        0,
    )
    assert (config.dsa.index_kpool, config.dsa.index_head_dim, config.dsa.index_topk) == (
        16,
        128,
        2048,
    )
    assert config.dsa.indexer_types == ("full",) * 45
    assert config.linear_attention is not None
    assert (config.linear_attention.num_heads, config.linear_attention.head_dim) == (64, 128)
    assert config.linear_attention.lower_bound == -5.0
    assert config.moe is not None
    assert (config.moe.num_experts, config.moe.num_shared_experts) == (288, 1)
    assert config.moe.routed_scaling_factor == 2.5
    assert config.moe.mlp_layer_types[:4] == ("dense", "dense", "dense", "sparse")
    assert config.mhc is not None
    assert config.mhc.num_streams == 4
    assert (config.head_dim, config.pad_token_id, config.mtp) == (256, 154820, None)


def test_glm5_next_text_config_alone(tmp_path: Path) -> None:
    hf = transformers.Glm5NextTextConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        index_topk=32,
        index_kpool=8,
    )
    config = model_config_from_hf_file(_saved(tmp_path, hf))
    assert config.model_type == "glm5_next_text"
    assert config.num_layers_of_type(SPARSE_ATTENTION) == 1
    assert config.dsa is not None
    assert config.dsa.index_kpool == 8
    assert config.moe is not None
    assert len(config.moe.mlp_layer_types) == 6


def test_glm5_next_derived_schedules_and_linear_attn_config(glm5_wrapper_json: Path) -> None:
    text = json.loads(glm5_wrapper_json.read_text())["text_config"]
    for derived in ("layer_types", "mlp_layer_types", "indexer_types"):
        del text[derived]
    text.update(
        num_hidden_layers=8,
        index_topk_pattern="FSFSFSFS",
        linear_attn_config={"num_heads": 16, "gate_lower_bound": None},
        num_mtp_layers=1,
        mtp_layer_types=["indexed_attention"],
    )
    config = model_config_from_hf_dict(text, source="flat")
    assert config.layer_types == (LINEAR_ATTENTION,) * 3 + (SPARSE_ATTENTION,) + (
        LINEAR_ATTENTION,
    ) * 3 + (SPARSE_ATTENTION,)
    assert config.moe is not None
    assert config.moe.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 5
    assert config.dsa is not None
    assert config.dsa.indexer_types == ("full", "shared") * 4
    assert config.linear_attention is not None
    assert (config.linear_attention.num_heads, config.linear_attention.lower_bound) == (16, -5.0)
    assert config.mtp is not None
    assert config.mtp.layer_types == (SPARSE_ATTENTION,)
