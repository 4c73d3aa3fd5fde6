"""Int8 weights (``quantization=int8``): which modules swap, tied storage, the bytes the plan
prices, and each projection's output within the error its format allows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import quantize_per_row
from metrale_kernels.reference.int8_matmul import error_bound
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.weight_format import Quantization

if TYPE_CHECKING:
    from .conftest import PagedRunner

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def pair(config: ModelConfig, seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """The float32 model and the int8 one, built from the same random weights."""
    torch.manual_seed(seed)
    weights = {name: t.clone() for name, t in LlamaForCausalLM(config).state_dict().items()}
    built = [
        build_model(
            config, weights.items(), LoadOptions(dtype=torch.float32, device="cpu", quantization=q)
        )
        for q in (Quantization.NONE, Quantization.INT8)
    ]
    assert all(isinstance(model, LlamaForCausalLM) for model in built)
    return built[0], built[1]  # type: ignore[return-value]


def storage_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters()]
    tensors += [b for name, b in model.named_buffers() if not name.endswith("cos_sin_cache")]
    storages = {t.untyped_storage().data_ptr(): t for t in tensors}
    return sum(t.untyped_storage().nbytes() for t in storages.values())


@pytest.mark.parametrize("tied", [False, True])
def test_projections_embeddings_and_head_are_int8_and_priced_exactly(
    tiny_config: ModelConfig, tied: bool
) -> None:
    config = attrs.evolve(tiny_config, tie_word_embeddings=tied, qkv_bias=True)
    _, model = pair(config)
    for layer in model.model.layers:
        for name in PROJECTIONS:
            owner = layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp
            assert isinstance(getattr(owner, name), Int8Linear), name
        assert layer.self_attn.qkv_proj.bias is not None  # biases stay float32
    embedding = model.model.embed_tokens
    assert isinstance(embedding, Int8Embedding)
    assert isinstance(model.lm_head, Int8Linear)
    shares = model.lm_head.qweight.data_ptr() == embedding.qweight.data_ptr()
    assert shares is tied
    assert storage_bytes(model) == weight_bytes(config, 4, Quantization.INT8).total()


def test_each_projection_is_within_the_int8_bound(tiny_config: ModelConfig) -> None:
    reference, model = pair(tiny_config, seed=1)
    x = torch.randn(5, tiny_config.hidden_size) * 2
    pairs = [
        (reference.model.layers[0].self_attn.qkv_proj, model.model.layers[0].self_attn.qkv_proj),
        (reference.model.layers[1].mlp.gate_up_proj, model.model.layers[1].mlp.gate_up_proj),
        (reference.lm_head, model.lm_head),
    ]
    for float_layer, int8_layer in pairs:
        bound = error_bound(x, float_layer.weight)
        with torch.inference_mode():
            error = (int8_layer(x) - float_layer(x)).abs()
        assert bool((error <= bound + 1e-5).all())


def test_embedding_rows_are_the_dequantized_table(tiny_config: ModelConfig) -> None:
    reference, model = pair(tiny_config, seed=2)
    ids = torch.tensor([0, 7, 7, 100])
    table = reference.model.embed_tokens.weight
    _, scale = quantize_per_row(table)
    with torch.inference_mode():
        error = (model.model.embed_tokens(ids) - table[ids]).abs()
    assert bool((error <= scale[ids, None] / 2 + 1e-6).all())


def test_int8_model_runs_paged_steps_close_to_float32(
    tiny_config: ModelConfig, paged_runner: type[PagedRunner]
) -> None:
    """A sanity check on the whole stack (prefill then decode through the paged cache), not a
    format bound: the int8 model's logits stay near the float32 model's."""
    reference, model = pair(tiny_config, seed=3)
    prompt = {0: [5, 9, 2, 77, 31, 8], 1: [3, 3, 40]}
    runs = [paged_runner(m, num_blocks=8, block_size=4) for m in (reference, model)]
    for step in (prompt, {0: [12], 1: [99]}):
        expected, got = (run.step(step) for run in runs)
        for seq_id in step:
            relative = (got[seq_id] - expected[seq_id]).norm() / expected[seq_id].norm()
            assert float(relative) < 0.05
