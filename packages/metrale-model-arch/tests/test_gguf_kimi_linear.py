"""GGUF of Kimi Linear (llama.cpp's ``kimi-linear``): a tiny random checkpoint saved in Moonshot's
form (``linear_attn_config``, ``first_k_dense_replace``, the dense layers' ``mlp``), converted the
way llama.cpp's converter does (:mod:`metrale_testing.llama_cpp_kimi_linear`: per-layer kv head
counts, ``(1, channels, 1, kernel)`` conv1d kernels, ``-exp(A_log)``, stacked experts, the split
``kv_b_proj``) loads to the safetensors load's config, weights and prefill logits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import pytest
import torch
from metrale_testing import randomize_weights
from metrale_testing.gguf_parity import (
    ConvertedCheckpoint,
    as_the_file_holds,
    assert_gguf_logits_equal,
    assert_gguf_weights_equal,
    model_fields,
)
from metrale_testing.llama_cpp_gguf import convert_to_gguf
from safetensors.torch import load_file, save_file

from metrale_config import (
    ConfigError,
    model_config_from_gguf,
    model_config_from_gguf_header,
    model_config_from_hf_file,
    read_gguf_header,
)
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.kimi_linear import KimiLinearForCausalLM
from metrale_model_arch.loading.gguf_loader import load_gguf_model

transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
LINEAR, FULL = "linear_attention", "full_attention"
# llama.cpp sizes KDA by attention.head_count and routes without expert groups (the converter
# reads n_group, which Moonshot's config spells num_expert_group), so both stay as it runs them.
SMALL: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 24,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "num_local_experts": 8,
    "num_experts_per_tok": 3,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.446,
    "linear_num_heads": 4,
    "linear_head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
CASES: dict[str, dict[str, Any]] = {
    # The low-rank query, one dense layer, one shared expert.
    "lora-query": {
        "q_lora_rank": 24,
        "qk_nope_head_dim": 16,
        "n_shared_experts": 1,
        "linear_conv_kernel_dim": 4,
        "layer_types": [LINEAR, FULL, LINEAR, FULL],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
    },
    # The released full-rank query, two dense layers, two shared experts, key rows of 32
    # (attn_k_b quantizes in Q8_0 rather than falling back to F16).
    "full-rank-query": {
        "q_lora_rank": None,
        "qk_nope_head_dim": 32,
        "n_shared_experts": 2,
        "linear_conv_kernel_dim": 3,
        "layer_types": [FULL, LINEAR, LINEAR, FULL],
        "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
    },
}
OPTIONS = LoadOptions(dtype=torch.float32, device="cpu")
_DENSE_FFN = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.(gate|up|down)_proj\.weight")


def save_moonshot_form(path: Path, **kwargs: Any) -> None:
    """A random transformers Kimi Linear saved as Moonshot publishes it: the config's
    ``linear_attn_config`` (1-based layer lists), ``first_k_dense_replace`` and
    ``moe_router_activation_func``, the dense layers' FFN under ``mlp``."""
    hf_model = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**kwargs)).eval()
    randomize_weights(hf_model, torch.Generator().manual_seed(0), buffers=True)
    hf_model.save_pretrained(path, safe_serialization=True)
    config_file = path / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    layer_types, mlp_layer_types = config.pop("layer_types"), config.pop("mlp_layer_types")
    config["linear_attn_config"] = {
        "head_dim": config.pop("linear_head_dim"),
        "num_heads": config.pop("linear_num_heads"),
        "short_conv_kernel_size": config.pop("linear_conv_kernel_dim"),
        "kda_layers": [i + 1 for i, kind in enumerate(layer_types) if kind == LINEAR],
        "full_attn_layers": [i + 1 for i, kind in enumerate(layer_types) if kind == FULL],
    }
    config["first_k_dense_replace"] = mlp_layer_types.count("dense")
    config["moe_router_activation_func"] = "sigmoid"
    config["mla_use_nope"] = True
    config_file.write_text(json.dumps(config), encoding="utf-8")
    weights_file = path / "model.safetensors"
    tensors = load_file(weights_file)
    renamed = {_DENSE_FFN.sub(r"\1mlp.\2_proj.weight", name): t for name, t in tensors.items()}
    save_file(renamed, weights_file, metadata={"format": "pt"})


@pytest.fixture(scope="module", params=list(CASES))
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ConvertedCheckpoint:
    path = tmp_path_factory.mktemp(request.param)
    checkpoint_dir = path / "hf"
    save_moonshot_form(checkpoint_dir, **SMALL, **CASES[request.param])
    return ConvertedCheckpoint(
        name=request.param,
        checkpoint_dir=checkpoint_dir,
        f32=convert_to_gguf(checkpoint_dir, path / "model-f32.gguf", Q.F32),
        q8_0=convert_to_gguf(checkpoint_dir, path / "model-q8_0.gguf", Q.Q8_0),
    )


def test_the_file_has_llama_cpp_layout(converted: ConvertedCheckpoint) -> None:
    reader = gguf.GGUFReader(converted.q8_0)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    kda = CASES[converted.name]["layer_types"].index(LINEAR)
    mla = CASES[converted.name]["layer_types"].index(FULL)
    # ggml order: (kernel, 1, channels, 1); rows of a few taps fall back to F16.
    conv = tensors[f"blk.{kda}.ssm_conv1d_q.weight"]
    assert list(conv.shape) == [CASES[converted.name]["linear_conv_kernel_dim"], 1, 64, 1]
    assert conv.tensor_type == Q.F16
    assert tensors[f"blk.{kda}.ssm_a"].tensor_type == Q.F32
    assert bool((tensors[f"blk.{kda}.ssm_a"].data < 0).all())
    assert {f"blk.{mla}.attn_k_b.weight", f"blk.{mla}.attn_v_b.weight"} <= tensors.keys()
    assert "blk.3.ffn_gate_exps.weight" in tensors
    kv_heads = reader.fields["kimi-linear.attention.head_count_kv"]
    counts = [int(kv_heads.parts[i][0]) for i in kv_heads.data]
    assert counts == [int(kind == FULL) for kind in CASES[converted.name]["layer_types"]]


def test_header_config_equals_config_json(converted: ConvertedCheckpoint) -> None:
    from_json = model_config_from_hf_file(converted.checkpoint_dir)
    from_gguf = model_config_from_gguf(converted.f32)
    assert from_gguf.model_type == "kimi_linear"
    assert model_fields(from_gguf) == model_fields(from_json)


def expected_state(converted: ConvertedCheckpoint, qtype: Q) -> dict[str, torch.Tensor]:
    """The safetensors load's weights as a ``qtype`` file holds them: matrices in ``qtype`` but
    the routers; ``kv_b_proj`` as its halves are held."""
    config = model_config_from_hf_file(converted.checkpoint_dir)
    assert config.mla is not None
    nope, v = config.mla.qk_nope_head_dim, config.mla.v_head_dim
    expected = {}
    for name, tensor in converted.load_safetensors().state_dict().items():
        values = tensor.numpy()
        if values.ndim < 2 or name.endswith(("mlp.gate.weight", "A_log")):
            expected[name] = tensor
            continue
        if name.endswith("kv_b_proj.weight"):
            per_head = values.reshape(-1, nope + v, values.shape[-1])
            k_b = as_the_file_holds(per_head[:, :nope].transpose(0, 2, 1).copy(), qtype)
            v_b = as_the_file_holds(per_head[:, nope:].copy(), qtype)
            values = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(values.shape)
        else:
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
    assert isinstance(gguf_model, KimiLinearForCausalLM)
    reference = converted.load_safetensors()
    assert_gguf_logits_equal(gguf_model, reference, expected_state(converted, qtype), paged_runner)


@pytest.mark.parametrize(
    "key",
    ["kda.head_dim", "ssm.conv_kernel", "attention.key_length_mla", "expert_gating_func"],
)
def test_a_file_without_a_kimi_size_is_refused(converted: ConvertedCheckpoint, key: str) -> None:
    header = read_gguf_header(converted.f32)
    fields = {name: value for name, value in header.fields.items() if name != f"kimi-linear.{key}"}
    with pytest.raises(ConfigError, match=re.escape(f"'kimi-linear.{key}'")):
        model_config_from_gguf_header(attrs.evolve(header, fields=fields))
