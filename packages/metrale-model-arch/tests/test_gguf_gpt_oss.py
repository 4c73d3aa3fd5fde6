"""GGUF of gpt-oss (llama.cpp's ``gpt-oss``): a tiny random checkpoint, its experts in float or
in MXFP4 (as gpt-oss ships), converted the way llama.cpp's converter does
(:mod:`metrale_testing.llama_cpp_gguf`: experts split into gate and up and transposed; MXFP4
repacked as ggml's MXFP4 blocks) loads to the safetensors load's config, weights and prefill
logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from metrale_testing.gguf_parity import (
    ConvertedCheckpoint,
    as_the_file_holds,
    assert_gguf_logits_equal,
    assert_gguf_weights_equal,
    model_fields,
)
from metrale_testing.llama_cpp_gguf import convert_to_gguf
from safetensors.torch import load_file, save_file

from metrale_config import model_config_from_gguf, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.gpt_oss import GptOssForCausalLM
from metrale_model_arch.loading.gguf_loader import load_gguf_model
from metrale_model_arch.loading.mxfp4_checkpoints import E8M0_BIAS

transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
# MXFP4 groups 32 input features: hidden 64 and intermediate 32 are whole groups. The SwiGLU's
# alpha and clamp are gpt-oss's own (llama.cpp fixes them; the file does not say).
SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 32,
    "head_dim": 16,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "sliding_window": 6,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    },
}
CASES = ("float-experts", "mxfp4-experts")
OPTIONS = LoadOptions(dtype=torch.float32, device="cpu")
EXPERT_PROJECTIONS = {
    "gate_up_proj": (2 * SMALL["intermediate_size"], SMALL["hidden_size"]),
    "down_proj": (SMALL["hidden_size"], SMALL["intermediate_size"]),
}


def save_tiny_gpt_oss(path: Path, is_mxfp4: bool) -> None:
    hf_model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**SMALL))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in hf_model.named_parameters():
            noise = torch.randn(tensor.shape, generator=generator)
            scale = 1.0 if name.endswith("sinks") else 0.2
            tensor.copy_(1.0 + 0.2 * noise if "norm" in name else scale * noise)
    hf_model.save_pretrained(path, safe_serialization=True)
    if is_mxfp4:
        as_mxfp4_checkpoint(path, generator)


def as_mxfp4_checkpoint(path: Path, generator: torch.Generator) -> None:
    """``path``'s experts replaced by random MXFP4 blocks and scales, as gpt-oss ships them."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    experts = SMALL["num_local_experts"]
    for layer in range(SMALL["num_hidden_layers"]):
        for proj, (rows, cols) in EXPERT_PROJECTIONS.items():
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            del tensors[name]
            blocks = torch.randint(256, (experts, rows, cols // 32, 16), generator=generator)
            scales = torch.randint(
                E8M0_BIAS - 5, E8M0_BIAS - 1, (experts, rows, cols // 32), generator=generator
            )
            tensors[f"{name}_blocks"] = blocks.to(torch.uint8)
            tensors[f"{name}_scales"] = scales.to(torch.uint8)
    save_file(tensors, file, metadata={"format": "pt"})
    config_file = path / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["quantization_config"] = {"quant_method": "mxfp4"}
    config_file.write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture(scope="module", params=CASES)
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ConvertedCheckpoint:
    path = tmp_path_factory.mktemp(request.param)
    checkpoint_dir = path / "hf"
    save_tiny_gpt_oss(checkpoint_dir, is_mxfp4=request.param == "mxfp4-experts")
    return ConvertedCheckpoint(
        name=request.param,
        checkpoint_dir=checkpoint_dir,
        f32=convert_to_gguf(checkpoint_dir, path / "model-f32.gguf", Q.F32),
        q8_0=convert_to_gguf(checkpoint_dir, path / "model-q8_0.gguf", Q.Q8_0),
    )


def test_the_experts_have_the_case_type(converted: ConvertedCheckpoint) -> None:
    types = {tensor.name: tensor.tensor_type for tensor in gguf.GGUFReader(converted.q8_0).tensors}
    want = Q.MXFP4 if converted.name == "mxfp4-experts" else Q.Q8_0
    for part in ("gate", "up", "down"):
        assert types[f"blk.0.ffn_{part}_exps.weight"] == want


def test_header_config_equals_config_json(converted: ConvertedCheckpoint) -> None:
    from_json = model_config_from_hf_file(converted.checkpoint_dir)
    from_gguf = model_config_from_gguf(converted.f32)
    assert from_gguf.model_type == "gpt_oss"
    assert model_fields(from_gguf) == model_fields(from_json)


def expected_state(converted: ConvertedCheckpoint, qtype: Q) -> dict[str, torch.Tensor]:
    """The safetensors load's weights as a ``qtype`` file holds them: the float experts' gate,
    up and down as llama.cpp lays them out (MXFP4 experts are exact either way)."""
    state = converted.load_safetensors().state_dict()
    if qtype == Q.F32:
        return state
    expected = {}
    for name, tensor in state.items():
        values = tensor.numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            if converted.name == "float-experts":
                rows = values.swapaxes(-1, -2).copy()  # (experts, 2 * inter, hidden)
                rows[:, ::2] = as_the_file_holds(rows[:, ::2].copy(), qtype)
                rows[:, 1::2] = as_the_file_holds(rows[:, 1::2].copy(), qtype)
                values = rows.swapaxes(-1, -2)
        elif name.endswith("mlp.experts.down_proj"):
            if converted.name == "float-experts":
                values = as_the_file_holds(values.swapaxes(-1, -2).copy(), qtype).swapaxes(-1, -2)
        elif values.ndim >= 2 and not name.endswith(("mlp.router.weight", "bias")):
            # The converter keeps biases (the experts' are 2-D) and the router in float32.
            values = as_the_file_holds(values, qtype)
        expected[name] = torch.from_numpy(np.ascontiguousarray(values))
    return expected


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_weights_equal_the_safetensors_load(converted: ConvertedCheckpoint, qtype: Q) -> None:
    loaded = load_gguf_model(converted.path(qtype), OPTIONS).state_dict()
    assert_gguf_weights_equal(loaded, expected_state(converted, qtype))


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_prefill_logits_match_the_safetensors_load(
    converted: ConvertedCheckpoint, qtype: Q, paged_runner: Any
) -> None:
    gguf_model = load_gguf_model(converted.path(qtype), OPTIONS)
    assert isinstance(gguf_model, GptOssForCausalLM)
    assert_gguf_logits_equal(
        gguf_model, converted.load_safetensors(), expected_state(converted, qtype), paged_runner
    )
