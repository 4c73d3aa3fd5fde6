"""``shard_config`` and ``shard_checkpoint``: what one rank holds, by hand."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import save_file

from metrale_config import ModelConfig, MoeConfig
from metrale_model_arch.loading.safetensors_loader import (
    checkpoint_tensor_names,
    iter_safetensors,
)
from metrale_model_arch.parallel import (
    TensorParallelError,
    TensorShard,
    check_runs_split,
    shard_checkpoint,
    shard_config,
)
from metrale_model_arch.parallel.checkpoint_shard import CheckpointSharder
from metrale_model_arch.q4_1_blocks import Q4_1Blocks


def test_two_ranks_hold_half_of_every_split_size(tiny_config: ModelConfig) -> None:
    config = attrs.evolve(tiny_config, vocab_size=100)
    rank = shard_config(config, 2)
    assert (rank.num_attention_heads, rank.num_key_value_heads) == (2, 1)
    assert (rank.intermediate_size, rank.vocab_size) == (24, 50)
    assert (rank.hidden_size, rank.head_dim) == (32, 8)
    assert shard_config(config, 1) is config


def test_fewer_kv_heads_than_ranks_are_replicated(tiny_config: ModelConfig) -> None:
    config = attrs.evolve(tiny_config, vocab_size=100)
    assert shard_config(config, 4).num_key_value_heads == 1
    # Query heads 0-1 read KV head 0, heads 2-3 KV head 1: ranks 0, 1 | 2, 3.
    heads = [TensorShard(rank=r, world_size=4).kv_heads(2) for r in range(4)]
    assert heads == [slice(0, 1), slice(0, 1), slice(1, 2), slice(1, 2)]


@pytest.mark.parametrize(
    ("world_size", "named"),
    [(3, "num_attention_heads (4)"), (8, "num_attention_heads (4)")],
)
def test_a_size_that_does_not_divide_names_the_flag(
    tiny_config: ModelConfig, world_size: int, named: str
) -> None:
    with pytest.raises(TensorParallelError, match=rf"--tensor-parallel-size {world_size}.*"):
        shard_config(attrs.evolve(tiny_config, vocab_size=120), world_size)
    with pytest.raises(TensorParallelError, match=named.replace("(", r"\(").replace(")", r"\)")):
        shard_config(attrs.evolve(tiny_config, vocab_size=120), world_size)


def test_the_vocabulary_must_divide(tiny_config: ModelConfig) -> None:
    with pytest.raises(TensorParallelError, match=r"vocab_size \(101\)"):
        shard_config(tiny_config, 2)


def test_experts_split_and_glm_is_planned_but_does_not_run(
    tiny_config: ModelConfig, tiny_glm5_next: ModelConfig
) -> None:
    moe = MoeConfig(
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        mlp_layer_types=("sparse",) * 2,
    )
    config = attrs.evolve(tiny_config, model_type="qwen3_moe", vocab_size=100, moe=moe)
    rank_moe = shard_config(config, 2).moe
    assert rank_moe is not None
    assert (rank_moe.num_experts, rank_moe.num_experts_per_tok) == (4, 2)
    check_runs_split(config, 2)
    glm = shard_config(tiny_glm5_next, 2)
    assert glm.linear_attention is not None
    assert tiny_glm5_next.linear_attention is not None
    assert glm.linear_attention.num_heads * 2 == tiny_glm5_next.linear_attention.num_heads
    assert glm.mla == tiny_glm5_next.mla  # the latent cache is every rank's
    with pytest.raises(TensorParallelError, match="does not run split yet"):
        check_runs_split(tiny_glm5_next, 2)


def test_checkpoint_tensors_narrow_to_the_rank(tiny_config: ModelConfig) -> None:
    config = attrs.evolve(tiny_config, vocab_size=100)
    layer = "model.layers.0."

    def tensor(*shape: int) -> torch.Tensor:
        return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)

    weights = {
        f"{layer}self_attn.q_proj.weight": tensor(32, 32),  # 4 heads x 8
        f"{layer}self_attn.k_proj.weight": tensor(16, 32),  # 2 KV heads x 8
        f"{layer}self_attn.o_proj.weight": tensor(32, 32),
        f"{layer}self_attn.o_proj.bias": tensor(32),
        f"{layer}mlp.gate_proj.weight": tensor(48, 32),
        f"{layer}mlp.down_proj.weight": tensor(32, 48),
        f"{layer}mlp.gate.weight": tensor(8, 32),  # a router of 8 experts
        f"{layer}mlp.experts.5.up_proj.weight": tensor(16, 32),
        f"{layer}mlp.experts.1.up_proj.weight": tensor(16, 32),
        "model.embed_tokens.weight": tensor(100, 32),
        f"{layer}input_layernorm.weight": tensor(32),
    }
    moe = MoeConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
    shard = TensorShard(rank=1, world_size=2)
    narrowed = list(shard_checkpoint(weights.items(), attrs.evolve(config, moe=moe), shard))
    got = dict(narrowed)
    # Expert 5 is rank 1's expert 1; expert 1 is rank 0's, dropped.
    assert len(narrowed) == len(weights) - 1
    assert set(got) == set(weights) - {f"{layer}mlp.experts.5.up_proj.weight"}
    assert torch.equal(
        got[f"{layer}self_attn.q_proj.weight"], weights[f"{layer}self_attn.q_proj.weight"][16:]
    )
    assert torch.equal(
        got[f"{layer}self_attn.k_proj.weight"], weights[f"{layer}self_attn.k_proj.weight"][8:]
    )
    assert torch.equal(
        got[f"{layer}self_attn.o_proj.weight"], weights[f"{layer}self_attn.o_proj.weight"][:, 16:]
    )
    assert torch.equal(
        got[f"{layer}self_attn.o_proj.bias"], weights[f"{layer}self_attn.o_proj.bias"]
    )
    assert torch.equal(
        got[f"{layer}mlp.gate_proj.weight"], weights[f"{layer}mlp.gate_proj.weight"][24:]
    )
    assert torch.equal(
        got[f"{layer}mlp.down_proj.weight"], weights[f"{layer}mlp.down_proj.weight"][:, 24:]
    )
    assert torch.equal(got[f"{layer}mlp.gate.weight"], weights[f"{layer}mlp.gate.weight"][4:])
    assert torch.equal(
        got[f"{layer}mlp.experts.1.up_proj.weight"], weights[f"{layer}mlp.experts.5.up_proj.weight"]
    )
    assert torch.equal(got["model.embed_tokens.weight"], weights["model.embed_tokens.weight"][50:])
    assert torch.equal(
        got[f"{layer}input_layernorm.weight"], weights[f"{layer}input_layernorm.weight"]
    )


def test_safetensors_reads_only_the_slices_a_rank_holds(
    tiny_config: ModelConfig, tmp_path: Path
) -> None:
    config = attrs.evolve(
        tiny_config,
        vocab_size=100,
        moe=MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    )
    generator = torch.Generator().manual_seed(0)
    layer = "model.layers.1."
    weights = {
        f"{layer}self_attn.v_proj.weight": torch.randn(16, 32, generator=generator),
        f"{layer}self_attn.o_proj.weight": torch.randn(32, 32, generator=generator),
        f"{layer}mlp.experts.0.down_proj.weight": torch.randn(32, 16, generator=generator),
        f"{layer}mlp.experts.3.down_proj.weight": torch.randn(32, 16, generator=generator),
        "lm_head.weight": torch.randn(100, 32, generator=generator),
    }
    save_file(weights, str(tmp_path / "model.safetensors"))
    for rank in (0, 1):
        shard = TensorShard(rank=rank, world_size=2)
        read = list(
            iter_safetensors(
                checkpoint_tensor_names(tmp_path),
                slice_of=CheckpointSharder(config, shard).slice_of,
            )
        )
        narrowed = list(shard_checkpoint(sorted(weights.items()), config, shard))
        assert sorted(name for name, _ in read) == sorted(name for name, _ in narrowed)
        expected = dict(narrowed)
        for name, tensor in read:
            assert torch.equal(tensor, expected[name]), name


def q4_1_blocks(rows: int, cols: int, seed: int) -> Q4_1Blocks:
    gguf = pytest.importorskip("gguf")
    values = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).numpy()
    return Q4_1Blocks(gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1))


@pytest.mark.parametrize(
    "index",
    [(slice(16, 48),), (slice(None), slice(32, 96)), (slice(0, 16), slice(64, 128))],
)
def test_a_ggufs_q4_1_blocks_narrow_to_a_shard_as_blocks(index: tuple[slice, ...]) -> None:
    """A rank's rows, or its columns on whole blocks of 32, stay blocks (a q4 projection takes
    them bit for bit): the same values as the dequantized tensor's part."""
    blocks = q4_1_blocks(64, 128, seed=0)
    part = blocks[index]
    assert isinstance(part, Q4_1Blocks)
    assert torch.equal(part.dequantize(), blocks.dequantize()[index])


def test_columns_off_the_blocks_narrow_to_floats() -> None:
    blocks = q4_1_blocks(16, 128, seed=1)
    index = (slice(None), slice(16, 80))
    part = blocks[index]
    assert isinstance(part, torch.Tensor)
    assert torch.equal(part, blocks.dequantize()[index])


def test_shard_checkpoint_keeps_a_ggufs_blocks(tiny_config: ModelConfig) -> None:
    config = attrs.evolve(tiny_config, hidden_size=64, intermediate_size=128)
    down = q4_1_blocks(64, 128, seed=2)
    name = "model.layers.0.mlp.down_proj.weight"
    shard = TensorShard(rank=1, world_size=2)
    [(got_name, part)] = shard_checkpoint([(name, down)], config, shard)
    assert got_name == name
    assert isinstance(part, Q4_1Blocks)
    assert torch.equal(part.dequantize(), down.dequantize()[:, 64:])
