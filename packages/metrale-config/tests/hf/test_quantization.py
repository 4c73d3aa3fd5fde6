"""``quantization_config`` of AWQ and GPTQ int4 checkpoints: what is read, and every variant
refused naming its field and value."""

from __future__ import annotations

from typing import Any

import pytest

from metrale_config import ConfigError, Int4Method, Int4Quantization, model_config_from_hf_dict

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def parse(quantization: dict[str, Any]) -> Int4Quantization | None:
    config = model_config_from_hf_dict(
        {**LLAMA, "quantization_config": quantization}, source="config.json"
    )
    assert config.quantization_method == quantization["quant_method"]
    return config.int4_quantization


def test_awq_gemm_is_read() -> None:
    assert parse(AWQ) == Int4Quantization(method=Int4Method.AWQ, group_size=128)


@pytest.mark.parametrize(("sym", "desc_act"), [(True, False), (False, True)])
def test_gptq_is_read(sym: bool, desc_act: bool) -> None:
    quantization = {**GPTQ, "sym": sym, "desc_act": desc_act, "checkpoint_format": "gptq"}
    assert parse(quantization) == Int4Quantization(
        method=Int4Method.GPTQ, group_size=128, is_symmetric=sym, desc_act=desc_act
    )


def test_a_group_size_of_minus_one_is_one_group() -> None:
    parsed = parse({**GPTQ, "group_size": -1})
    assert parsed is not None
    assert parsed.group_size is None
    assert parsed.describe() == "gptq int4, group whole row, symmetric"


def test_no_config_and_other_methods_are_not_int4() -> None:
    assert model_config_from_hf_dict(LLAMA, source="config.json").int4_quantization is None
    assert parse({"quant_method": "fp8", "weight_block_size": [128, 128]}) is None


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({**AWQ, "bits": 8}, r"'quantization_config.bits' is 8: only 4-bit awq"),
        ({**GPTQ, "bits": 3}, r"'quantization_config.bits' is 3: only 4-bit gptq"),
        ({**AWQ, "version": "gemv"}, r"'quantization_config.version' is 'gemv'"),
        ({**AWQ, "version": "marlin"}, r"'quantization_config.version' is 'marlin'"),
        ({**AWQ, "version": "exllama"}, r"'quantization_config.version' is 'exllama'"),
        ({**AWQ, "zero_point": False}, r"'quantization_config.zero_point' is false"),
        ({**GPTQ, "checkpoint_format": "gptq_v2"}, r"checkpoint_format' is 'gptq_v2'"),
        ({**GPTQ, "is_marlin_format": True}, r"'quantization_config.is_marlin_format' is true"),
        ({**GPTQ, "group_size": 0}, r"'quantization_config.group_size' must be positive or -1"),
    ],
)
def test_other_variants_are_refused_naming_the_field(
    quantization: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(quantization)
