"""``--speculative-config`` as vLLM spells it."""

from __future__ import annotations

import pytest

from metrale_server.speculative_config import SpeculativeConfig


def test_vllm_json_parses() -> None:
    config = SpeculativeConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}'
    )
    assert (config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (
        5,
        1,
        3,
    )


def test_a_draft_model_config_parses() -> None:
    config = SpeculativeConfig.from_json(
        '{"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 3}'
    )
    assert (config.method, config.model, config.num_speculative_tokens) == (
        "draft_model",
        "/models/small",
        3,
    )
    assert config.quantization is None
    quantized = SpeculativeConfig.from_json(
        '{"method": "draft_model", "model": "/models/small", "quantization": "int8"}'
    )
    assert quantized.quantization == "int8"


@pytest.mark.parametrize("method", ["mtp", "deepseek_mtp", "glm4_moe_mtp", "qwen3_next_mtp"])
def test_mtp_and_its_vllm_aliases_parse(method: str) -> None:
    config = SpeculativeConfig.from_json(f'{{"method": "{method}", "num_speculative_tokens": 2}}')
    assert (config.method, config.num_speculative_tokens, config.model) == ("mtp", 2, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"num_speculative_tokens": 2}', "method is required"),
        ('{"method": "eagle"}', "not built yet; this server has ngram, draft_model, mtp"),
        ('{"method": "mtp", "model": "x"}', "model and quantization are for method draft_model"),
        ('{"method": "draft_model"}', "needs model"),
        ('{"method": "draft_model", "model": 3}', "model must be a string"),
        ('{"method": "beam"}', "method must be one of"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "1..16"),
        ('{"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}', "lookup_min"),
        ('{"method": "ngram", "num_speculative_tokens": "4"}', "must be an integer"),
        ('{"method": "ngram", "model": "x"}', "model and quantization are for method draft_model"),
        ('{"method": "draft_model", "model": "x", "quantization": "int4"}', "must be one of"),
        ('{"method": "draft_model", "model": "x", "quantization": 8}', "must be a string"),
        ('{"method": "ngram", "draft": "x"}', "unknown keys draft"),
    ],
)
def test_bad_configs_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_json(text)
