"""q4 weights (``quantization=q4``): which modules swap, the blocks kept bit for bit, the bytes
the plan prices, shapes the blocks cannot tile, and a model whose weights are already q4 values
running as the float32 model does, within the activations' two-digit rounding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import dequantize_q4, quantize_q4
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_model_arch.families.q4_layers import Q4Linear
from metrale_model_arch.load import load_model
from metrale_model_arch.loading.gguf_loader import read_gguf_weights
from metrale_model_arch.memory.weights import q4_support_error, weight_bytes
from metrale_model_arch.model_source import resolve_model
from metrale_model_arch.weight_format import Quantization, q4_matrix_bytes

if TYPE_CHECKING:
    from .conftest import PagedRunner

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@pytest.fixture
def q4_config(tiny_config: ModelConfig) -> ModelConfig:
    """The tiny config with every projection in whole blocks (input features % 32)."""
    return attrs.evolve(tiny_config, intermediate_size=64)


def q4_valued_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the checkpoint's names (q, k, v, gate and up apart), their
    projections exactly representable as q4 blocks (as a Q4_1 GGUF's dequantized tensors are)."""
    torch.manual_seed(seed)
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in LlamaForCausalLM(config).state_dict().items():
        if any(f"{projection}." in name for projection in PROJECTIONS) and tensor.dim() == 2:
            tensor = dequantize_q4(*quantize_q4(tensor))
        if ".qkv_proj." in name:
            parts = tensor.split([q_size, kv_size, kv_size])
            for part, values in zip("qkv", parts, strict=True):
                weights[name.replace(".qkv_proj.", f".{part}_proj.")] = values.clone()
        elif ".gate_up_proj." in name:
            for part, values in zip(("gate", "up"), tensor.chunk(2), strict=True):
                weights[name.replace(".gate_up_proj.", f".{part}_proj.")] = values.clone()
        else:
            weights[name] = tensor.clone()
    return weights


def build(
    config: ModelConfig, weights: dict[str, torch.Tensor], quantization: Quantization
) -> LlamaForCausalLM:
    model = build_model(
        config,
        weights.items(),
        LoadOptions(
            dtype=torch.float32, device="cpu", quantization=quantization, kernel_backend="torch"
        ),
    )
    assert isinstance(model, LlamaForCausalLM)
    return model


def storage_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters()]
    tensors += [b for name, b in model.named_buffers() if not name.endswith("cos_sin_cache")]
    storages = {t.untyped_storage().data_ptr(): t for t in tensors}
    return sum(t.untyped_storage().nbytes() for t in storages.values())


@pytest.mark.parametrize("tied", [False, True])
def test_projections_are_q4_the_embeddings_and_head_int8_priced_exactly(
    q4_config: ModelConfig, tied: bool
) -> None:
    config = attrs.evolve(q4_config, tie_word_embeddings=tied, qkv_bias=True)
    model = build(config, q4_valued_weights(config, 0), Quantization.Q4)
    for layer in model.model.layers:
        for name in PROJECTIONS:
            owner = layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp
            assert isinstance(getattr(owner, name), Q4Linear), name
        assert layer.self_attn.qkv_proj.bias is not None  # biases stay float32
    assert isinstance(model.model.embed_tokens, Int8Embedding)
    assert isinstance(model.lm_head, Int8Linear)
    assert storage_bytes(model) == weight_bytes(config, 4, Quantization.Q4).total()
    int8 = weight_bytes(config, 4, Quantization.INT8)
    q4 = weight_bytes(config, 4, Quantization.Q4)
    assert (q4.embeddings, q4.lm_head) == (int8.embeddings, int8.lm_head)
    assert q4.layers < int8.layers


def test_q4_matrix_bytes_are_five_bits_a_weight() -> None:
    assert q4_matrix_bytes(16, 32) == 16 * 32 * 5 // 8
    assert q4_matrix_bytes(960, 576) == 960 * 576 // 2 + 960 * 18 * 4


def test_the_fused_projections_hold_each_checkpoint_tensors_blocks(q4_config: ModelConfig) -> None:
    weights = q4_valued_weights(q4_config, 1)
    model = build(q4_config, weights, Quantization.Q4)
    layer = model.model.layers[1]
    prefix = "model.layers.1"
    qkv = torch.cat([weights[f"{prefix}.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([weights[f"{prefix}.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    for linear, matrix in ((layer.self_attn.qkv_proj, qkv), (layer.mlp.gate_up_proj, gate_up)):
        assert isinstance(linear, Q4Linear)
        packed, scales = quantize_q4(matrix)
        assert torch.equal(linear.packed, packed)
        assert torch.equal(linear.scales, scales)
        assert torch.equal(dequantize_q4(linear.packed, linear.scales), matrix)


def test_a_q4_valued_model_runs_paged_steps_as_the_float32_one(
    q4_config: ModelConfig, paged_runner: type[PagedRunner]
) -> None:
    """The projections' weights being exact, only the activations' digits (about 1/32000 of a
    row's largest value) and the int8 embeddings and head part the two models."""
    weights = q4_valued_weights(q4_config, 2)
    reference, model = (
        build(q4_config, weights, Quantization.NONE),
        build(q4_config, weights, Quantization.Q4),
    )
    prompt = {0: [5, 9, 2, 77, 31, 8], 1: [3, 3, 40]}
    runs = [paged_runner(m, num_blocks=8, block_size=4) for m in (reference, model)]
    for step in (prompt, {0: [12], 1: [99]}):
        expected, got = (run.step(step) for run in runs)
        for seq_id in step:
            relative = (got[seq_id] - expected[seq_id]).norm() / expected[seq_id].norm()
            assert float(relative) < 0.02
            assert torch.equal(got[seq_id].argmax(-1), expected[seq_id].argmax(-1))


def test_shapes_the_blocks_cannot_tile_are_refused(tiny_config: ModelConfig) -> None:
    # intermediate 48: the down projection's 48 input features are not whole blocks of 32
    error = q4_support_error(tiny_config)
    assert error is not None
    assert "(32, 48)" in error
    with pytest.raises(ValueError, match="multiples of 32"):
        weight_bytes(tiny_config, 4, Quantization.Q4)
    torch.manual_seed(0)
    weights = LlamaForCausalLM(tiny_config).state_dict()
    with pytest.raises(ValueError, match="down_proj"):
        build(tiny_config, weights, Quantization.Q4)
    assert q4_support_error(attrs.evolve(tiny_config, intermediate_size=64)) is None


def test_rows_are_written_by_whole_panels(q4_config: ModelConfig) -> None:
    model = build(q4_config, q4_valued_weights(q4_config, 3), Quantization.Q4)
    linear = model.model.layers[0].mlp.gate_up_proj
    assert isinstance(linear, Q4Linear)
    before = linear.packed.clone()
    with pytest.raises(ValueError, match="panels of 16 rows"):
        linear.write_rows((slice(8, 24),), torch.zeros(16, q4_config.hidden_size))
    with pytest.raises(ValueError, match="slices of whole rows"):
        linear.write_rows((0,), torch.zeros(q4_config.hidden_size))
    assert torch.equal(linear.packed, before)
    linear.write_rows((slice(16, 32),), torch.zeros(16, q4_config.hidden_size))
    assert bool((dequantize_q4(linear.packed, linear.scales)[16:32] == 0).all())
    assert torch.equal(linear.packed[:1], before[:1])


def test_other_model_types_have_no_q4_path(tiny_config: ModelConfig) -> None:
    config = attrs.evolve(tiny_config, model_type="glm5_next")
    error = q4_support_error(config)
    assert error is not None
    assert "not supported" in error


@pytest.mark.slow
def test_the_default_models_q4_1_blocks_are_kept_bit_for_bit() -> None:
    """The bundled GGUF's projections are Q4_1: as q4 they are its dequantized values exactly
    (loaded as blocks, never dequantized: ``Q4_1Blocks``)."""
    source = resolve_model(None)
    assert source.kind == "gguf"
    _, weights = read_gguf_weights(source.path)
    checkpoint = dict(weights)
    loaded = load_model(
        None, LoadOptions(dtype=torch.float32, device="cpu", quantization=Quantization.Q4)
    )
    model = loaded.model
    assert isinstance(model, LlamaForCausalLM)
    for index, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{index}"
        fused = {
            layer.self_attn.qkv_proj: [f"self_attn.{p}_proj" for p in "qkv"],
            layer.self_attn.o_proj: ["self_attn.o_proj"],
            layer.mlp.gate_up_proj: ["mlp.gate_proj", "mlp.up_proj"],
            layer.mlp.down_proj: ["mlp.down_proj"],
        }
        for linear, parts in fused.items():
            assert isinstance(linear, Q4Linear)
            expected = torch.cat([checkpoint[f"{prefix}.{part}.weight"] for part in parts])
            assert torch.equal(dequantize_q4(linear.packed, linear.scales), expected), parts
            # The file's blocks moved in, byte for byte what quantizing their values gives.
            packed, scales = quantize_q4(expected)
            assert torch.equal(linear.packed, packed), parts
            assert torch.equal(linear.scales, scales), parts
