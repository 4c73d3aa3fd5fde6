"""GGUF of DeepSeek-V2 / V2-Lite / V3 (llama.cpp's ``deepseek2``): a tiny random checkpoint
converted the way llama.cpp's converter does (:mod:`metrale_testing.llama_cpp_gguf`), with
``kv_b_proj`` split into ``attn_k_b`` / ``attn_v_b`` or, as older converters wrote it, whole,
loads to the safetensors load's config, weights and prefill logits."""

from __future__ import annotations

import json
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

from metrale_config import model_config_from_gguf, model_config_from_hf_file, read_gguf_header
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.deepseek import DeepseekForCausalLM
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.gguf_loader import load_gguf_model

transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
HF_CLASSES = {
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}
# What DeepSeek's published config.json files say and a transformers save leaves out.
PUBLISHED_ROUTING = {
    "deepseek_v2": {"scoring_func": "softmax"},
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
}


def yarn(mscale: float) -> dict[str, Any]:
    # DeepSeek's configs set mscale and mscale_all_dim alike (the GGUF keeps one of them).
    return {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": mscale,
        "mscale_all_dim": mscale,
    }


@attrs.frozen
class Case:
    model_type: str
    kwargs: dict[str, Any]
    # As llama.cpp's converter wrote it before its MLA change: kv_b_proj whole.
    legacy_mla: bool = False


CASES = {
    # V2-Lite: q_proj, greedy routing, two shared experts, the first layer dense.
    "v2-lite": Case(
        "deepseek_v2",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": None,
            "topk_method": "greedy",
            "num_experts_per_tok": 2,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
        },
    ),
    # V2: the low-rank query, group-limited routing, scaled weights, attention biases, YaRN.
    "v2-lora-yarn-legacy": Case(
        "deepseek_v2",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": 24,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "routed_scaling_factor": 2.0,
            "first_k_dense_replace": 0,
            "attention_bias": True,
            "rope_parameters": yarn(0.707),
        },
        legacy_mla=True,
    ),
    # V3: sigmoid routing with its correction bias, groups, renormalized and scaled; YaRN;
    # key rows of 32 (attn_k_b quantizes in Q8_0 rather than falling back to F16).
    "v3-yarn": Case(
        "deepseek_v3",
        {
            "num_hidden_layers": 3,
            "q_lora_rank": 24,
            "qk_nope_head_dim": 32,
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1,
            "rope_parameters": yarn(1.0),
            "num_nextn_predict_layers": 0,
        },
    ),
    # V3 without q_lora_rank, ungrouped, every layer sparse, a tied head, plain RoPE.
    "v3-tied-legacy": Case(
        "deepseek_v3",
        {
            "num_hidden_layers": 2,
            "q_lora_rank": None,
            "n_group": 1,
            "topk_group": 1,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.5,
            "first_k_dense_replace": 0,
            "rope_theta": 500.0,
            "tie_word_embeddings": True,
            "num_nextn_predict_layers": 0,
        },
        legacy_mla=True,
    ),
}
OPTIONS = LoadOptions(dtype=torch.float32, device="cpu")


def save_tiny_deepseek(path: Path, model_type: str, **kwargs: Any) -> None:
    config_class, model_class = HF_CLASSES[model_type]
    hf_model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
    randomize_weights(hf_model, torch.Generator().manual_seed(0), buffers=True)
    hf_model.save_pretrained(path, safe_serialization=True)
    config_file = path / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config_file.write_text(json.dumps({**config, **PUBLISHED_ROUTING[model_type]}), "utf-8")


@pytest.fixture(scope="module", params=list(CASES))
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ConvertedCheckpoint:
    case = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    checkpoint_dir = path / "hf"
    save_tiny_deepseek(checkpoint_dir, case.model_type, **{**SMALL, **case.kwargs})

    def convert(qtype: Q) -> Path:
        out = path / f"model-{qtype.name.lower()}.gguf"
        return convert_to_gguf(checkpoint_dir, out, qtype, legacy_mla=case.legacy_mla)

    return ConvertedCheckpoint(
        name=request.param,
        checkpoint_dir=checkpoint_dir,
        f32=convert(Q.F32),
        q8_0=convert(Q.Q8_0),
    )


def test_the_file_has_the_case_layout(converted: ConvertedCheckpoint) -> None:
    names = {tensor.name for tensor in gguf.GGUFReader(converted.f32).tensors}
    is_legacy = CASES[converted.name].legacy_mla
    assert ("blk.0.attn_kv_b.weight" in names) == is_legacy
    assert ("blk.0.attn_k_b.weight" in names) == (not is_legacy)


def test_header_config_equals_config_json(converted: ConvertedCheckpoint) -> None:
    from_json = model_config_from_hf_file(converted.checkpoint_dir)
    from_gguf = model_config_from_gguf(converted.f32)
    assert from_gguf.model_type == CASES[converted.name].model_type
    assert model_fields(from_gguf) == model_fields(from_json)


def expected_state(converted: ConvertedCheckpoint, qtype: Q) -> dict[str, torch.Tensor]:
    """The safetensors load's weights as a ``qtype`` file holds them; ``kv_b_proj`` as its
    halves are held when the file splits it."""
    state = converted.load_safetensors().state_dict()
    if qtype == Q.F32:
        return state
    mla = model_config_from_hf_file(converted.checkpoint_dir).mla
    assert mla is not None
    is_split = not CASES[converted.name].legacy_mla
    expected = {}
    for name, tensor in state.items():
        values = tensor.numpy()
        # The converter keeps routers (``mlp.gate``) in float32.
        if values.ndim < 2 or name.endswith("mlp.gate.weight"):
            expected[name] = tensor
            continue
        if is_split and name.endswith("self_attn.kv_b_proj.weight"):
            values = split_as_the_file_holds(values, mla.qk_nope_head_dim, mla.v_head_dim, qtype)
        else:
            values = as_the_file_holds(values, qtype)
        expected[name] = torch.from_numpy(np.ascontiguousarray(values))
    return expected


def split_as_the_file_holds(kv_b: np.ndarray, nope: int, v: int, qtype: Q) -> np.ndarray:
    per_head = kv_b.reshape(-1, nope + v, kv_b.shape[-1])
    k_b = as_the_file_holds(per_head[:, :nope].transpose(0, 2, 1).copy(), qtype)
    v_b = as_the_file_holds(per_head[:, nope:].copy(), qtype)
    return np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(kv_b.shape)


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_weights_equal_the_safetensors_load(converted: ConvertedCheckpoint, qtype: Q) -> None:
    loaded = load_gguf_model(converted.path(qtype), OPTIONS).state_dict()
    assert_gguf_weights_equal(loaded, expected_state(converted, qtype))


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_prefill_logits_match_the_safetensors_load(
    converted: ConvertedCheckpoint, qtype: Q, paged_runner: Any
) -> None:
    gguf_model = load_gguf_model(converted.path(qtype), OPTIONS)
    assert isinstance(gguf_model, DeepseekForCausalLM)
    assert_gguf_logits_equal(
        gguf_model, converted.load_safetensors(), expected_state(converted, qtype), paged_runner
    )


def test_a_lone_half_of_kv_b_is_refused(converted: ConvertedCheckpoint) -> None:
    """One of llama.cpp's two halves without the other (the split file less its ``attn_v_b``;
    the whole file's ``attn_kv_b`` named as a half) names the tensor it cannot rebuild."""
    header = read_gguf_header(converted.f32)
    lone = []
    for info in header.tensors:
        if info.name == "blk.1.attn_v_b.weight":
            continue
        if info.name == "blk.1.attn_kv_b.weight":
            info = attrs.evolve(info, name="blk.1.attn_k_b.weight")
        lone.append(info)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.self_attn\.kv_b_proj\.weight'"):
        load_gguf_model(attrs.evolve(header, tensors=tuple(lone)), OPTIONS)
