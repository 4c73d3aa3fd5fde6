"""``quantization_config`` of FP8 checkpoints (transformers'/vLLM's ``fp8``, compressed-tensors'
``float-quantized``): what is read, and every variant refused naming its field and value."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from metrale_config import (
    ConfigError,
    Fp8Granularity,
    Fp8Method,
    Fp8Quantization,
    model_config_from_hf_dict,
)

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
DEEPSEEK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]}  # fmt: skip
WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
           "dynamic": False, "group_size": None, "block_structure": None}  # fmt: skip
DYNAMIC_INPUT = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
COMPRESSED: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": WEIGHTS, "input_activations": DYNAMIC_INPUT}
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
}
BLOCK = Fp8Granularity.BLOCK


def parse(quantization: dict[str, Any]) -> Fp8Quantization | None:
    config = model_config_from_hf_dict(
        {**LLAMA, "quantization_config": quantization}, source="config.json"
    )
    assert config.quantization_method == quantization["quant_method"]
    assert config.int4_quantization is None or config.fp8_quantization is None
    return config.fp8_quantization


def compressed(**weights: Any) -> dict[str, Any]:
    changed = copy.deepcopy(COMPRESSED)
    changed["config_groups"]["group_0"]["weights"].update(weights)
    return changed


def test_deepseek_block_fp8_is_read() -> None:
    parsed = parse(DEEPSEEK)
    assert parsed == Fp8Quantization(
        method=Fp8Method.FP8, granularities=(BLOCK,), block_size=(128, 128)
    )
    assert parsed.scale_name == "weight_scale_inv"
    assert parsed.describe() == "fp8 weights (block 128x128)"


def test_per_tensor_fp8_with_static_activations_is_read() -> None:
    parsed = parse({"quant_method": "fp8", "activation_scheme": "static"})
    assert parsed == Fp8Quantization(
        method=Fp8Method.FP8,
        granularities=(Fp8Granularity.TENSOR,),
        has_static_activations=True,
    )
    assert parsed.scale_name == "weight_scale"
    assert parsed.describe() == "fp8 weights (per tensor)"


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"strategy": "channel"}, (Fp8Granularity.CHANNEL, None)),
        ({"strategy": "tensor"}, (Fp8Granularity.TENSOR, None)),
        ({"strategy": "block", "block_structure": [128, 64]}, (BLOCK, (128, 64))),
    ],
)
def test_compressed_tensors_fp8_is_read(
    weights: dict[str, Any], expected: tuple[Fp8Granularity, tuple[int, int] | None]
) -> None:
    parsed = parse(compressed(**weights))
    granularity, block_size = expected
    assert parsed == Fp8Quantization(
        method=Fp8Method.COMPRESSED_TENSORS, granularities=(granularity,), block_size=block_size
    )
    assert parsed.scale_name == "weight_scale"


def test_compressed_tensors_groups_of_several_strategies_and_static_inputs() -> None:
    quantization = compressed()
    static = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    quantization["config_groups"]["group_1"] = {
        "targets": ["re:.*mlp.*"],
        "weights": {**WEIGHTS, "strategy": "block", "block_structure": [128, 128]},
        "input_activations": static,
    }
    parsed = parse(quantization)
    assert parsed is not None
    assert parsed.granularities == (Fp8Granularity.CHANNEL, BLOCK)
    assert parsed.has_static_activations
    assert parsed.describe() == "compressed-tensors fp8 weights (per channel, block 128x128)"


def test_other_methods_are_not_fp8() -> None:
    assert model_config_from_hf_dict(LLAMA, source="config.json").fp8_quantization is None
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    assert parse(awq) is None


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({**DEEPSEEK, "fmt": "e5m2"}, r"'quantization_config.fmt' is 'e5m2': only e4m3"),
        ({**DEEPSEEK, "weight_block_size": [128]}, r"weight_block_size' must be two positive"),
        ({**DEEPSEEK, "activation_scheme": "x"}, r"activation_scheme' is 'x'"),
        (
            compressed(type="int"),
            r"'quantization_config.config_groups.group_0.weights.type' is 'int': only float",
        ),
        (compressed(num_bits=4), r"weights.num_bits' is 4: only 8-bit float"),
        (compressed(symmetric=False), r"weights.symmetric' is false"),
        (compressed(strategy="group", group_size=128), r"weights.strategy' is 'group'"),
        (compressed(strategy="block"), r"weights.block_structure' is missing"),
        (compressed(dynamic=True), r"weights.dynamic' is not false"),
        ({**COMPRESSED, "format": "pack-quantized"}, r"'quantization_config.format' is 'pack-q"),
        ({**COMPRESSED, "format": "int-quantized"}, r"'quantization_config.format' is 'int-q"),
        ({**COMPRESSED, "kv_cache_scheme": {"num_bits": 8}}, r"kv_cache_scheme' is set"),
        ({**COMPRESSED, "quantization_status": "frozen"}, r"quantization_status' is 'frozen'"),
        ({**COMPRESSED, "config_groups": {}}, r"'quantization_config.config_groups' is missing"),
    ],
)
def test_other_variants_are_refused_naming_the_field(
    quantization: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(quantization)
