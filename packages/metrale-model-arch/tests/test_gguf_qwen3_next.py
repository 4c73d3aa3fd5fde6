"""GGUF of Qwen3-Next (llama.cpp's ``qwen3next``): a tiny random checkpoint, its MTP layer
included, converted the way llama.cpp's converter does (:mod:`metrale_testing.llama_cpp_gguf`:
``in_proj_qkvz`` regrouped into ``attn_qkv`` / ``attn_gate``, ``-exp(A_log)``, the ``(1 + w)``
norms stored ``+ 1``, the MTP layer dropped) loads to the safetensors load's config (less its
MTP layer), weights and prefill logits; the first converted files' whole ``ssm_in`` loads too."""

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
from metrale_testing.gguf_parity import (
    ConvertedCheckpoint,
    as_the_file_holds,
    assert_gguf_logits_equal,
    assert_gguf_weights_equal,
    model_fields,
)
from metrale_testing.llama_cpp_gguf import convert_to_gguf
from metrale_testing.llama_cpp_qwen3next import qwen3next_metadata, split_qkvz
from metrale_testing.qwen3_next_mtp import add_qwen3_next_mtp, save_tiny_qwen3_next

from metrale_config import (
    ConfigError,
    GgufTensorInfo,
    ModelConfig,
    model_config_from_gguf,
    model_config_from_gguf_header,
    model_config_from_hf_file,
    read_gguf_header,
)
from metrale_model_arch import LoadOptions, mtp_free_config
from metrale_model_arch.families.qwen3_next import Qwen3NextForCausalLM
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.gguf_loader import load_gguf_model
from metrale_model_arch.loading.gguf_split_tensors import join_qkvz

transformers = pytest.importorskip("transformers")

Q = gguf.GGMLQuantizationType
SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_theta": 500.0,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    # llama.cpp always renormalizes the top-k weights (Qwen3-Next's own config says so too).
    "norm_topk_prob": True,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
# llama.cpp's converter maps no dense MLP for qwen3next (``mlp_only_layers`` stays empty) and
# places full attention every ``full_attention_interval``-th layer.
CASES = {
    # Value heads narrower than key heads, attention biases, a full layer every second one.
    "biased-interval-2": {
        "full_attention_interval": 2,
        "layer_types": ["linear_attention", "full_attention"] * 2,
        "partial_rotary_factor": 0.25,
        "attention_bias": True,
        "linear_key_head_dim": 12,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 3,
    },
    # The released layout: equal key and value dims, the interval 4, a tied head.
    "released-layout-tied": {
        "full_attention_interval": 4,
        "partial_rotary_factor": 0.5,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "tie_word_embeddings": True,
    },
}
OPTIONS = LoadOptions(dtype=torch.float32, device="cpu")


@attrs.frozen(kw_only=True)
class Converted(ConvertedCheckpoint):
    def safetensors_config(self) -> ModelConfig:
        return mtp_free_config(super().safetensors_config())


@pytest.fixture(scope="module", params=list(CASES))
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Converted:
    path = tmp_path_factory.mktemp(request.param)
    checkpoint_dir = path / "hf"
    hf_model = save_tiny_qwen3_next(checkpoint_dir, **SMALL, **CASES[request.param])
    full_layer = hf_model.config.layer_types.index("full_attention")
    add_qwen3_next_mtp(checkpoint_dir, torch.Generator().manual_seed(1), source_layer=full_layer)
    return Converted(
        name=request.param,
        checkpoint_dir=checkpoint_dir,
        f32=convert_to_gguf(checkpoint_dir, path / "model-f32.gguf", Q.F32),
        q8_0=convert_to_gguf(checkpoint_dir, path / "model-q8_0.gguf", Q.Q8_0),
    )


def test_the_file_has_llama_cpp_layout(converted: Converted) -> None:
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(converted.q8_0).tensors}
    assert not any("mtp" in name or "nextn" in name for name in tensors)
    assert {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_a"} <= tensors.keys()
    assert "blk.0.ssm_in.weight" not in tensors
    assert tensors["blk.0.ssm_conv1d.weight"].tensor_type == Q.F32
    assert tensors["blk.0.ssm_a"].tensor_type == Q.F32
    assert bool((tensors["blk.0.ssm_a"].data < 0).all())


def test_header_config_equals_config_json_less_mtp(converted: Converted) -> None:
    from_json = model_config_from_hf_file(converted.checkpoint_dir)
    assert from_json.mtp is not None
    from_gguf = model_config_from_gguf(converted.f32)
    assert from_gguf.model_type == "qwen3_next"
    assert model_fields(from_gguf) == model_fields(mtp_free_config(from_json))


def expected_state(converted: Converted, qtype: Q) -> dict[str, torch.Tensor]:
    """The safetensors load's weights as a ``qtype`` file holds them: the ``(1 + w)`` norms
    through the converter's float32 ``w + 1`` and the loader's ``- 1``; matrices in ``qtype``
    but the routers and the conv1d kernels, which the converter keeps in float32."""
    expected = {}
    for name, tensor in converted.load_safetensors().state_dict().items():
        values = tensor.numpy()
        if name.endswith("norm.weight") and "linear_attn" not in name:
            values = (values + np.float32(1)) - np.float32(1)
        is_float32 = values.ndim < 2 or name.endswith(("mlp.gate.weight", "conv1d.weight"))
        if not is_float32:
            values = as_the_file_holds(values, qtype)
        expected[name] = torch.from_numpy(np.ascontiguousarray(values))
    return expected


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_weights_equal_the_safetensors_load(converted: Converted, qtype: Q) -> None:
    loaded = load_gguf_model(converted.path(qtype), OPTIONS).state_dict()
    assert_gguf_weights_equal(loaded, expected_state(converted, qtype))


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_prefill_logits_match_the_safetensors_load(
    converted: Converted, qtype: Q, paged_runner: Any
) -> None:
    gguf_model = load_gguf_model(converted.path(qtype), OPTIONS)
    assert isinstance(gguf_model, Qwen3NextForCausalLM)
    reference = converted.load_safetensors()
    assert_gguf_logits_equal(gguf_model, reference, expected_state(converted, qtype), paged_runner)


def test_split_qkvz_and_its_join_invert_each_other() -> None:
    hparams = {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 6,
        "linear_key_head_dim": 3,
        "linear_value_head_dim": 2,
    }
    qkvz = np.arange(2 * (3 + 3 + 3 * 2 + 3 * 2) * 5, dtype=np.float32).reshape(-1, 5)
    qkv, z = split_qkvz(qkvz, hparams)
    # All q rows (key head 0, then 1) come first: head 1's q starts at its own row 18.
    assert qkv[3, 0] == qkvz[18, 0]
    assert np.array_equal(join_qkvz(qkv, z, num_key_heads=2), qkvz)
    with pytest.raises(ValueError, match="do not split into 4 key heads"):
        join_qkvz(qkv, z, num_key_heads=4)


def rewritten(converted: Converted, path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """``converted``'s metadata with ``tensors`` instead of its own, written to ``path``."""
    hparams = json.loads((converted.checkpoint_dir / "config.json").read_text("utf-8"))
    writer = gguf.GGUFWriter(path, "qwen3next")
    qwen3next_metadata(writer, hparams, hparams["num_hidden_layers"])
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def file_tensors(path: Path) -> dict[str, np.ndarray]:
    return {tensor.name: np.array(tensor.data) for tensor in gguf.GGUFReader(path).tensors}


def test_the_first_converted_files_whole_ssm_in_loads(converted: Converted, tmp_path: Path) -> None:
    """Before the converter split ``in_proj_qkvz``, it stored it whole as ``ssm_in``, as the
    checkpoint holds it (llama.cpp still reads such files)."""
    tensors = file_tensors(converted.f32)
    for name in [name for name in tensors if name.endswith("attn_qkv.weight")]:
        prefix = name.removesuffix("attn_qkv.weight")
        qkv, z = tensors.pop(name), tensors.pop(f"{prefix}attn_gate.weight")
        tensors[f"{prefix}ssm_in.weight"] = join_qkvz(qkv, z, num_key_heads=2)
    loaded = load_gguf_model(rewritten(converted, tmp_path / "legacy.gguf", tensors), OPTIONS)
    for name, tensor in load_gguf_model(converted.f32, OPTIONS).state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_non_negative_ssm_a_is_refused(converted: Converted, tmp_path: Path) -> None:
    tensors = file_tensors(converted.f32)
    tensors["blk.0.ssm_a"] = np.abs(tensors["blk.0.ssm_a"])
    path = rewritten(converted, tmp_path / "positive.gguf", tensors)
    with pytest.raises(CheckpointError, match=r"'blk\.0\.ssm_a' must hold -exp\(x\)"):
        load_gguf_model(path, OPTIONS)


def test_a_lone_part_of_qkvz_is_refused(converted: Converted) -> None:
    header = read_gguf_header(converted.f32)
    lone = tuple(info for info in header.tensors if info.name != "blk.0.attn_gate.weight")
    with pytest.raises(CheckpointError, match=r"in_proj_qkvz\.weight'.*attn_qkv and attn_gate"):
        load_gguf_model(attrs.evolve(header, tensors=lone), OPTIONS)


def test_a_sparse_layer_without_its_shared_expert_gate_is_refused(converted: Converted) -> None:
    header = read_gguf_header(converted.f32)
    tensors: tuple[GgufTensorInfo, ...] = tuple(
        info for info in header.tensors if info.name != "blk.1.ffn_gate_inp_shexp.weight"
    )
    message = re.escape("'qwen3next.expert_shared_feed_forward_length' names a shared expert")
    with pytest.raises(ConfigError, match=message + ".*blk.1 lacks"):
        model_config_from_gguf_header(attrs.evolve(header, tensors=tensors))


@pytest.mark.parametrize(
    "key", ["ssm.group_count", "ssm.inner_size", "ssm.state_size", "rope.dimension_count"]
)
def test_a_file_without_a_linear_attention_size_is_refused(converted: Converted, key: str) -> None:
    header = read_gguf_header(converted.f32)
    fields = {name: value for name, value in header.fields.items() if name != f"qwen3next.{key}"}
    with pytest.raises(ConfigError, match=re.escape(f"'qwen3next.{key}'")):
        model_config_from_gguf_header(attrs.evolve(header, fields=fields))
