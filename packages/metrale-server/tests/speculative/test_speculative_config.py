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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"num_speculative_tokens": 2}', "method is required"),
        ('{"method": "draft_model"}', "not built yet"),
        ('{"method": "beam"}', "method must be one of"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "1..16"),
        ('{"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}', "lookup_min"),
        ('{"method": "ngram", "num_speculative_tokens": "4"}', "must be an integer"),
        ('{"method": "ngram", "model": "x"}', "unknown keys model"),
    ],
)
def test_bad_configs_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_json(text)
