"""Parity of the routed-expert families (qwen3_moe, mixtral) with HF transformers, and their
GGUF files (qwen3moe; Mixtral as llama) against their safetensors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import pytest
import torch
from metrale_testing import paged_greedy, transformers_greedy
from metrale_testing.device_scan import assert_tensors_made_on_the_models_device
from metrale_testing.padded_step import assert_padding_rows_change_nothing
from safetensors import safe_open

from metrale_config import (
    ModelConfig,
    model_config_from_gguf_header,
    model_config_from_hf_file,
    read_gguf_header,
)
from metrale_kernels.cpu.native import load_native_ops_if_possible
from metrale_model_arch import LoadOptions
from metrale_model_arch.families.mixtral import MixtralForCausalLM
from metrale_model_arch.families.moe import MoeForCausalLM, SparseMoeBlock
from metrale_model_arch.families.qwen3_moe import Qwen3MoeForCausalLM
from metrale_model_arch.loading.gguf_loader import load_gguf_model
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.registry import family_for
from metrale_model_arch.weight_format import Quantization

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 1000
BLOCK_SIZE = 4
NUM_GREEDY_TOKENS = 32
PROMPT_LENS = (1, 5, 11, 17, 26)
SMALL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}

# name → (HF config class, HF model class, config kwargs, expected mlp_layer_types)
CASES: dict[str, tuple[str, str, dict[str, Any], tuple[str, ...]]] = {
    "qwen3_moe-norm-topk-dense-layer": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_hidden_layers": 3,
            "head_dim": 16,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
        ("sparse", "dense", "sparse"),
    ),
    "qwen3_moe-unnormalized-sparse-step": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "intermediate_size": 80,
            "moe_intermediate_size": 24,
            "num_experts": 8,
            "num_experts_per_tok": 3,
            "norm_topk_prob": False,
            "decoder_sparse_step": 2,
            "tie_word_embeddings": True,
        },
        ("dense", "sparse", "dense", "sparse"),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": None,
        },
        ("sparse", "sparse"),
    ),
}


@attrs.frozen(kw_only=True)
class Checkpoint:
    case: str
    path: Path
    config: ModelConfig
    hf_model: Any
    prompts: dict[int, list[int]]


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random: norms around one, everything else wide enough that greedy
    decoding is not one token repeated and routing is far from ties."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)


def save_tiny_moe(case: str, path: Path, seed: int = 0) -> Any:
    """Save a tiny random ``case`` model with ``save_pretrained``; returns the HF model."""
    config_class, model_class, kwargs, _ = CASES[case]
    hf_config = getattr(transformers, config_class)(**SMALL, **kwargs)
    hf_model = getattr(transformers, model_class)(hf_config).eval()
    randomize(hf_model, seed)
    hf_model.save_pretrained(path, safe_serialization=True)
    return hf_model


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Checkpoint:
    path = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_moe(request.param, path)
    generator = torch.Generator().manual_seed(1)
    prompts = {
        seq_id: torch.randint(VOCAB_SIZE, (length,), generator=generator).tolist()
        for seq_id, length in enumerate(PROMPT_LENS)
    }
    return Checkpoint(
        case=request.param,
        path=path,
        config=model_config_from_hf_file(path),
        hf_model=hf_model,
        prompts=prompts,
    )


def load(
    checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, kernel_backend: str = "auto"
) -> MoeForCausalLM:
    options = LoadOptions(dtype=dtype, device="cpu", kernel_backend=kernel_backend)
    model = load_safetensors_model(checkpoint.path, checkpoint.config, options)
    assert isinstance(model, MoeForCausalLM)
    return model


def hf_logits(checkpoint: Checkpoint, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = checkpoint.hf_model(torch.tensor([prompt])).logits[0]
    return logits


def test_config_exercises_the_case(checkpoint: Checkpoint) -> None:
    config = checkpoint.config
    assert config.moe is not None
    assert config.moe.mlp_layer_types == CASES[checkpoint.case][3]
    assert config.moe.num_experts == 8
    assert config.moe.num_experts_per_tok >= 2
    assert config.sliding_window is None
    assert config.moe.norm_topk_prob == ("unnormalized" not in checkpoint.case)
    expected_family = Qwen3MoeForCausalLM if "qwen3" in config.model_type else MixtralForCausalLM
    assert family_for(config) is expected_family


def test_model_layers_follow_mlp_layer_types(checkpoint: Checkpoint) -> None:
    model = load(checkpoint)
    assert checkpoint.config.moe is not None
    kinds = tuple(
        "sparse" if isinstance(layer.mlp, SparseMoeBlock) else "dense"
        for layer in model.model.layers
    )
    assert kinds == checkpoint.config.moe.mlp_layer_types


def test_experts_are_stacked_from_the_saved_tensors(checkpoint: Checkpoint) -> None:
    model = load(checkpoint)
    layer = 1 if "sparse-step" in checkpoint.case else 0
    block = model.model.layers[layer].mlp
    assert isinstance(block, SparseMoeBlock)
    with safe_open(str(checkpoint.path / "model.safetensors"), framework="pt") as saved:
        names = list(saved.keys())
        prefix = f"model.layers.{layer}."
        if checkpoint.config.model_type == "mixtral":
            gate = saved.get_tensor(f"{prefix}block_sparse_moe.experts.3.w1.weight")
            up = saved.get_tensor(f"{prefix}block_sparse_moe.experts.3.w3.weight")
            down = saved.get_tensor(f"{prefix}block_sparse_moe.experts.3.w2.weight")
            router = saved.get_tensor(f"{prefix}block_sparse_moe.gate.weight")
        else:
            gate = saved.get_tensor(f"{prefix}mlp.experts.3.gate_proj.weight")
            up = saved.get_tensor(f"{prefix}mlp.experts.3.up_proj.weight")
            down = saved.get_tensor(f"{prefix}mlp.experts.3.down_proj.weight")
            router = saved.get_tensor(f"{prefix}mlp.gate.weight")
    assert not any("gate_up_proj" in name for name in names), "save_pretrained wrote fused experts"
    torch.testing.assert_close(block.experts.gate_up_proj[3], torch.cat([gate, up]), rtol=0, atol=0)
    torch.testing.assert_close(block.experts.down_proj[3], down, rtol=0, atol=0)
    torch.testing.assert_close(block.gate.weight, router, rtol=0, atol=0)


def test_experts_are_stored_input_major_and_multiplied_natively(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """On the CPU the loader keeps the stacked experts as transposed views of input-major
    storage, which the CPU backend's ``fused_moe`` multiplies with its native kernel."""
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here")
    model = load(checkpoint)
    for layer in model.model.layers:
        if isinstance(layer.mlp, SparseMoeBlock):
            assert layer.mlp.experts.gate_up_proj.stride(1) == 1
            assert layer.mlp.experts.down_proj.stride(1) == 1
    runner = paged_runner(model, num_blocks=64, block_size=BLOCK_SIZE)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        runner.step(checkpoint.prompts)
    assert "metrale::input_major_mm" in {event.name for event in profile.events()}


def test_ragged_prefill_matches_transformers(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    runner = paged_runner(load(checkpoint), num_blocks=64, block_size=BLOCK_SIZE)
    logits = runner.step(checkpoint.prompts)
    for seq_id, prompt in checkpoint.prompts.items():
        expected = hf_logits(checkpoint, prompt)
        assert logits[seq_id].shape == (len(prompt), VOCAB_SIZE)
        torch.testing.assert_close(logits[seq_id], expected, atol=1e-4, rtol=0)


def test_batched_greedy_decode_matches_transformers_generate(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    expected = {
        seq_id: transformers_greedy(checkpoint.hf_model, prompt, NUM_GREEDY_TOKENS)
        for seq_id, prompt in checkpoint.prompts.items()
    }

    runner = paged_runner(load(checkpoint), num_blocks=128, block_size=BLOCK_SIZE, seed=3)
    assert paged_greedy(runner, checkpoint.prompts, NUM_GREEDY_TOKENS) == expected


def test_every_tensor_is_made_on_the_models_device(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """With the reference ops a GPU's torch backend runs."""
    model = load(checkpoint, kernel_backend="torch")
    assert_tensors_made_on_the_models_device(
        model, paged_runner, checkpoint.prompts, num_blocks=128, block_size=BLOCK_SIZE
    )


def test_a_step_padded_to_a_bucket_gives_the_same_logits(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    """The property CUDA graphs' padded batches rely on (``metrale_testing.padded_step``)."""
    assert_padding_rows_change_nothing(
        load(checkpoint),
        paged_runner,
        checkpoint.prompts,
        bucket=8,
        num_blocks=128,
        block_size=BLOCK_SIZE,
    )


def test_chunked_prefill_matches_one_shot(
    checkpoint: Checkpoint, paged_runner: Callable[..., Any]
) -> None:
    model = load(checkpoint)
    prompt, other = checkpoint.prompts[4], checkpoint.prompts[3]
    one_shot = paged_runner(model, num_blocks=32, block_size=BLOCK_SIZE).step({0: prompt})[0]

    chunked = paged_runner(model, num_blocks=32, block_size=BLOCK_SIZE, seed=5)
    first = chunked.step({0: prompt[:9]})[0]
    # The second chunk shares its step with another sequence's whole prefill.
    second = chunked.step({1: other, 0: prompt[9:19]})
    third = chunked.step({0: prompt[19:]})[0]
    torch.testing.assert_close(torch.cat([first, second[0], third]), one_shot, atol=1e-4, rtol=0)
    torch.testing.assert_close(second[1], hf_logits(checkpoint, other), atol=1e-4, rtol=0)


def test_moe_family_refuses_a_config_without_experts(checkpoint: Checkpoint) -> None:
    with pytest.raises(ValueError, match="needs MoE fields"):
        Qwen3MoeForCausalLM(attrs.evolve(checkpoint.config, moe=None))


# --- GGUF -----------------------------------------------------------------------------------
_BLOCK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
_TOP_LEVEL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama Q/K rows: each head's rotary halves interleaved."""
    half = weight.shape[0] // num_heads // 2
    pairs = weight.reshape(num_heads, 2, half, *weight.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2)).reshape(weight.shape)


def gguf_tensors(hf_model: Any, config: ModelConfig, arch: str) -> dict[str, np.ndarray]:
    """llama.cpp's tensors for ``hf_model`` (transformers' in-memory, stacked expert layout)."""
    heads = {
        "attn_q.weight": config.num_attention_heads,
        "attn_k.weight": config.num_key_value_heads,
    }
    tensors: dict[str, np.ndarray] = {}
    for name, param in hf_model.named_parameters():
        weight = param.detach().numpy().copy()
        if name in _TOP_LEVEL_NAMES:
            tensors[_TOP_LEVEL_NAMES[name]] = weight
            continue
        _, _, layer, rest = name.split(".", 3)
        if rest == "mlp.experts.gate_up_proj":
            gate, up = np.split(weight, 2, axis=1)
            tensors[f"blk.{layer}.ffn_gate_exps.weight"] = np.ascontiguousarray(gate)
            tensors[f"blk.{layer}.ffn_up_exps.weight"] = np.ascontiguousarray(up)
            continue
        gguf_name = _BLOCK_NAMES[rest]
        if arch == "llama" and gguf_name in heads:
            weight = llama_cpp_permute(weight, heads[gguf_name])
        tensors[f"blk.{layer}.{gguf_name}"] = weight
    return tensors


def write_moe_gguf(path: Path, hf_model: Any, config: ModelConfig) -> None:
    assert config.moe is not None
    arch = "qwen3moe" if config.model_type == "qwen3_moe" else "llama"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    writer.add_expert_count(config.moe.num_experts)
    writer.add_expert_used_count(config.moe.num_experts_per_tok)
    if arch == "qwen3moe":
        writer.add_expert_feed_forward_length(config.moe.moe_intermediate_size)
    if not config.moe.norm_topk_prob:
        writer.add_expert_weights_norm(False)
    for name, data in gguf_tensors(hf_model, config, arch).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_model_equals_safetensors_model(
    checkpoint: Checkpoint, tmp_path: Path, paged_runner: Callable[..., Any]
) -> None:
    config = checkpoint.config
    gguf_path = tmp_path / "model.gguf"
    write_moe_gguf(gguf_path, checkpoint.hf_model, config)

    gguf_config = model_config_from_gguf_header(read_gguf_header(gguf_path))
    assert gguf_config.model_type == config.model_type
    assert gguf_config.moe == config.moe
    assert gguf_config.qk_norm == config.qk_norm
    assert gguf_config.tie_word_embeddings == config.tie_word_embeddings

    from_safetensors = load(checkpoint)
    from_gguf = load_gguf_model(gguf_path, LoadOptions(dtype=torch.float32, device="cpu"))
    expected = dict(from_safetensors.named_parameters())
    for name, param in from_gguf.named_parameters():
        torch.testing.assert_close(param, expected[name], rtol=0, atol=0, msg=name)

    prompts = checkpoint.prompts
    ours = paged_runner(from_gguf, num_blocks=64, block_size=BLOCK_SIZE).step(prompts)
    theirs = paged_runner(from_safetensors, num_blocks=64, block_size=BLOCK_SIZE).step(prompts)
    for seq_id in prompts:
        torch.testing.assert_close(ours[seq_id], theirs[seq_id], rtol=0, atol=1e-6)


def test_int8_weights_are_refused_for_moe_by_name(checkpoint: Checkpoint) -> None:
    with pytest.raises(ValueError, match="int8 weights are not supported"):
        load_safetensors_model(
            checkpoint.path,
            checkpoint.config,
            LoadOptions(dtype=torch.float32, device="cpu", quantization=Quantization.INT8),
        )
    with pytest.raises(ValueError, match="int8 weights are not supported"):
        weight_bytes(checkpoint.config, 4, Quantization.INT8)
