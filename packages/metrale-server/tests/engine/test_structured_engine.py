"""Structured outputs through the engine: every output follows its grammar, alone, batched
with unconstrained requests, with ``n`` > 1 and across preemption."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from metrale_server import LLM, SamplingParams
from metrale_server.engine.core import RequestError
from metrale_server.speculative_config import SpeculativeConfig
from metrale_server.structured import StructuredOutputsParams

PHONE = r"[0-9]{3}-[0-9]{4}"
RECORD_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "label": {"enum": ["alpha", "beta"]},
    },
    "required": ["id", "ok", "label"],
    "additionalProperties": False,
}
PROMPTS = [{"prompt_token_ids": [100 + 7 * i + j for j in range(5 + 3 * i)]} for i in range(8)]


def constrained(structured: StructuredOutputsParams, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens=64, seed=1, structured_outputs=structured, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), max_batch_size=16, dtype="float32")


def test_outputs_follow_their_grammar_in_a_mixed_batch(llm: LLM) -> None:
    params = [
        constrained(StructuredOutputsParams(regex=PHONE)),
        SamplingParams(max_tokens=20, seed=2, ignore_eos=True),
        constrained(StructuredOutputsParams(json=RECORD_SCHEMA), n=3),
        constrained(StructuredOutputsParams(choice=("left", "right"))),
    ] * 2
    outputs = llm.generate(PROMPTS, params)
    for output, param in zip(outputs, params, strict=True):
        for completion in output.outputs:
            text = completion.text
            structured = param.structured_outputs
            if structured is None:
                assert completion.finish_reason == "length"
                continue
            assert completion.finish_reason == "stop", text
            if structured.regex is not None:
                assert re.fullmatch(PHONE, text)
            elif structured.choice is not None:
                assert text in structured.choice
            else:
                record = json.loads(text)
                assert set(record) == {"id", "ok", "label"}
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_kv_blocks


def test_grammar_state_survives_preemption(tiny_model_dir: Path, llm: LLM) -> None:
    params = constrained(StructuredOutputsParams(json=RECORD_SCHEMA))
    reference = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
    starved = LLM(str(tiny_model_dir), max_batch_size=16, num_kv_blocks=6, dtype="float32")
    outputs = starved.generate(PROMPTS, params)
    assert starved.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].text for o in outputs] == reference


RECORDS_SCHEMA = {"type": "array", "items": RECORD_SCHEMA, "minItems": 6, "maxItems": 6}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_under_a_grammar_change_nothing(
    tiny_model_dir: Path, llm: LLM, temperature: float
) -> None:
    """n-gram drafts of a constrained output are verified under the grammar's mask at each
    position: greedy outputs are plain decoding's, sampled ones still follow the grammar."""
    speculative = LLM(
        str(tiny_model_dir),
        max_batch_size=16,
        dtype="float32",
        speculative_config=SpeculativeConfig(num_speculative_tokens=4),
    )
    params = SamplingParams(
        max_tokens=200,
        temperature=temperature,
        seed=3,
        structured_outputs=StructuredOutputsParams(json=RECORDS_SCHEMA),
    )
    outputs = [o.outputs[0] for o in speculative.generate(PROMPTS, params)]
    stats = speculative.engine.stats
    assert stats.num_accepted_tokens > 50, stats
    for completion in outputs:
        assert completion.finish_reason == "stop", completion.text
        records = json.loads(completion.text)
        assert len(records) == 6
        assert all(set(record) == {"id", "ok", "label"} for record in records)
    if temperature == 0.0:
        plain = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
        assert [completion.text for completion in outputs] == plain
    engine = speculative.engine
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_grammar_ends_the_output_despite_ignore_eos_and_min_tokens(llm: LLM) -> None:
    params = constrained(StructuredOutputsParams(regex=PHONE), ignore_eos=True, min_tokens=30)
    [output] = llm.generate(PROMPTS[:1], params)
    completion = output.outputs[0]
    assert re.fullmatch(PHONE, completion.text)
    assert completion.finish_reason == "stop"


def test_a_grammar_that_cannot_compile_is_refused(llm: LLM) -> None:
    with pytest.raises(RequestError, match="structured_outputs"):
        llm.engine.add_request(
            "bad", [1, 2, 3], constrained(StructuredOutputsParams(regex="(unclosed"))
        )
    assert not llm.engine.has_unfinished_requests()
