"""Every bad ``config.json`` is one ``ConfigError`` that names the field and the file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from metrale_config import ConfigError, UndeclaredLeverError, model_config_from_hf_file

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
}


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def _error(data: dict[str, Any], tmp_path: Path) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        model_config_from_hf_file(path)
    message = str(info.value)
    assert message.startswith(f"config.json at {path}: ")
    return message


def test_the_minimal_config_parses(tmp_path: Path) -> None:
    assert model_config_from_hf_file(_write(tmp_path, LLAMA)).head_dim == 8


def test_wrong_type_names_field_file_and_value(tmp_path: Path) -> None:
    path = _write(tmp_path, {**LLAMA, "hidden_size": "576"})
    with pytest.raises(ConfigError) as info:
        model_config_from_hf_file(path)
    assert str(info.value) == (
        f"config.json at {path}: field 'hidden_size' must be an integer, got str '576'"
    )


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "num_hidden_layers"])
def test_missing_required_field(tmp_path: Path, field: str) -> None:
    data = {key: value for key, value in LLAMA.items() if key != field}
    assert f"field '{field}' is missing" in _error(data, tmp_path)


def test_missing_model_type(tmp_path: Path) -> None:
    data = {key: value for key, value in LLAMA.items() if key != "model_type"}
    assert "field 'model_type' is missing" in _error(data, tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("num_attention_heads", True, "must be an integer, got bool True"),
        ("vocab_size", 320.0, "must be an integer, got float 320.0"),
        ("intermediate_size", None, "must be an integer, got null"),
        ("rms_norm_eps", "1e-5", "must be a number, got str '1e-5'"),
        ("tie_word_embeddings", 1, "must be a boolean, got int 1"),
        ("eos_token_id", [2, "x"], "must be an integer or a list of integers"),
        ("rope_parameters", [1], "must be an object, got list"),
    ],
)
def test_mistyped_field(tmp_path: Path, field: str, value: object, expected: str) -> None:
    assert f"field '{field}' {expected}" in _error({**LLAMA, field: value}, tmp_path)


def test_nested_field_is_named_with_its_parent(tmp_path: Path) -> None:
    data = {**LLAMA, "rope_parameters": {"rope_type": "linear", "factor": "2"}}
    assert "field 'rope_parameters.factor' must be a number" in _error(data, tmp_path)


def test_llama3_rope_needs_its_frequency_factors(tmp_path: Path) -> None:
    data = {**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert "field 'rope_scaling.low_freq_factor' is missing" in _error(data, tmp_path)


def test_unknown_model_type_lists_supported(tmp_path: Path) -> None:
    message = _error({**LLAMA, "model_type": "gpt2"}, tmp_path)
    assert "unsupported model_type 'gpt2'" in message
    for supported in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "glm5_next"):
        assert re.search(rf"\b{supported}\b", message.split("supported:")[1])


def test_invalid_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",')
    with pytest.raises(ConfigError, match=re.escape(f"config.json at {path}: invalid JSON")):
        model_config_from_hf_file(tmp_path)


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must hold a JSON object, got list"):
        model_config_from_hf_file(_write(tmp_path, [1, 2]))


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "config.json"))):
        model_config_from_hf_file(tmp_path)


def test_heads_must_divide_by_kv_heads(tmp_path: Path) -> None:
    message = _error({**LLAMA, "num_key_value_heads": 3}, tmp_path)
    assert "field 'num_attention_heads' (8) must be divisible by num_key_value_heads (3)" in message


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "num_hidden_layers"])
def test_sizes_must_be_positive(tmp_path: Path, field: str) -> None:
    assert f"field '{field}' must be positive, got 0" in _error({**LLAMA, field: 0}, tmp_path)


def test_layer_types_must_cover_every_layer(tmp_path: Path) -> None:
    data = {**LLAMA, "model_type": "qwen2", "layer_types": ["full_attention"]}
    message = _error(data, tmp_path)
    assert "field 'layer_types' must have num_hidden_layers (2) entries, got 1" in message


def test_unknown_layer_type(tmp_path: Path) -> None:
    data = {**LLAMA, "model_type": "qwen3", "layer_types": ["full_attention", "chunked"]}
    assert "field 'layer_types' has unknown layer type 'chunked'" in _error(data, tmp_path)


def test_experts_per_token_cannot_exceed_experts(tmp_path: Path) -> None:
    data = {**LLAMA, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}
    assert "field 'num_experts_per_tok' must be between 1 and" in _error(data, tmp_path)


def test_glm5_next_text_config_errors_name_the_nested_field(tmp_path: Path) -> None:
    text = {**LLAMA, "model_type": "glm5_next_text", "num_key_value_heads": 8, "index_kpool": 3}
    message = _error({"model_type": "glm5_next", "text_config": text}, tmp_path)
    assert "field 'text_config.index_topk' (2048) must be a multiple of index_kpool (3)" in message


def test_undeclared_lever_error_is_a_config_error() -> None:
    assert issubclass(UndeclaredLeverError, ConfigError)


def test_glm5_next_sizes_must_be_positive(tmp_path: Path) -> None:
    text = {**LLAMA, "model_type": "glm5_next_text", "num_key_value_heads": 8, "kv_lora_rank": 0}
    assert "field 'kv_lora_rank' must be positive, got 0" in _error(text, tmp_path)
