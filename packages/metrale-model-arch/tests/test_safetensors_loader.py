from __future__ import annotations

import json
import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import save_file

from metrale_config import ModelConfig
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import CheckpointError, build_model, column_major_names
from metrale_model_arch.families import LlamaForCausalLM
from metrale_model_arch.families.row_invariant_layers import make_float_linears_row_invariant
from metrale_model_arch.loading import is_progress_enabled, load_progress
from metrale_model_arch.loading.safetensors_loader import (
    checkpoint_tensor_names,
    is_base_model_checkpoint,
    load_safetensors_model,
)


def reference_weights(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """A randomly initialized model's tensors, as a checkpoint stores them (tied head omitted)."""
    torch.manual_seed(seed)
    weights = {k: v.clone() for k, v in LlamaForCausalLM(config).state_dict().items()}
    if config.tie_word_embeddings:
        del weights["lm_head.weight"]
    return weights


def write_sharded(
    directory: Path, weights: dict[str, torch.Tensor], num_shards: int
) -> dict[str, str]:
    names = sorted(weights)
    weight_map: dict[str, str] = {}
    for shard in range(num_shards):
        filename = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {name: weights[name] for name in names[shard::num_shards]}
        save_file(part, str(directory / filename))
        weight_map.update(dict.fromkeys(part, filename))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return weight_map


def assert_loaded(model: LlamaForCausalLM, weights: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    for name, tensor in weights.items():
        torch.testing.assert_close(state[name], tensor.to(state[name].dtype), atol=0, rtol=0)


def load(path: Path, config: ModelConfig, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    model = load_safetensors_model(path, config, LoadOptions(dtype=dtype, device="cpu"))
    assert isinstance(model, LlamaForCausalLM)
    return model


def test_single_file(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = reference_weights(tiny_config)
    save_file(weights, str(tmp_path / "model.safetensors"))
    model = load(tmp_path, tiny_config)
    assert_loaded(model, weights)
    assert not model.training
    assert all(not p.requires_grad and p.device.type == "cpu" for p in model.parameters())


def test_sharded_checkpoint_loads_every_shard(
    tmp_path: Path, tiny_config: ModelConfig, paged_runner: Callable[..., Any]
) -> None:
    weights = reference_weights(tiny_config)
    weight_map = write_sharded(tmp_path, weights, num_shards=3)
    names = checkpoint_tensor_names(tmp_path)
    assert [p.name for p in names] == sorted(set(weight_map.values()))
    assert sorted(n for file_names in names.values() for n in file_names) == sorted(weights)
    model = load(tmp_path, tiny_config)
    assert_loaded(model, weights)

    torch.manual_seed(0)
    reference = LlamaForCausalLM(tiny_config, backend=model.backend).eval()
    # The loader stores projections column-major on CPU: same layout, same kernels, same bits.
    for name in column_major_names(reference, torch.float32):
        module_name, _, leaf = name.rpartition(".")
        column_major = reference.get_parameter(name).detach().t().contiguous().t()
        setattr(reference.get_submodule(module_name), leaf, torch.nn.Parameter(column_major))
    make_float_linears_row_invariant(reference, torch.float32)  # as build_model does on CPU
    prompt = {0: [5, 17, 3, 99, 42, 8, 1]}
    expected = paged_runner(reference, num_blocks=4, block_size=4).step(prompt)[0]
    got = paged_runner(model, num_blocks=4, block_size=4).step(prompt)[0]
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_bfloat16_file_becomes_float32_model(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = {k: v.to(torch.bfloat16) for k, v in reference_weights(tiny_config).items()}
    save_file(weights, str(tmp_path / "model.safetensors"))
    model = load(tmp_path, tiny_config, torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert_loaded(model, weights)


def test_float32_file_becomes_bfloat16_model(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = reference_weights(tiny_config)
    save_file(weights, str(tmp_path / "model.safetensors"))
    model = load(tmp_path, tiny_config, torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.cos_sin_cache.dtype == torch.float32
    assert_loaded(model, weights)


def test_tied_head_is_the_embedding_and_a_stored_head_is_ignored(
    tmp_path: Path, tiny_config: ModelConfig
) -> None:
    tied = attrs.evolve(tiny_config, tie_word_embeddings=True)
    weights = reference_weights(tied)
    assert "lm_head.weight" not in weights
    save_file(weights, str(tmp_path / "model.safetensors"))
    model = load(tmp_path, tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_loaded(model, weights)

    with_head = {
        **weights,
        "lm_head.weight": torch.zeros_like(weights["model.embed_tokens.weight"]),
    }
    save_file(with_head, str(tmp_path / "model.safetensors"))
    model = load(tmp_path, tied)
    torch.testing.assert_close(model.lm_head.weight, weights["model.embed_tokens.weight"])


def test_rotary_inv_freq_buffers_are_ignored(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = reference_weights(tiny_config)
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(weights, str(tmp_path / "model.safetensors"))
    assert_loaded(load(tmp_path, tiny_config), reference_weights(tiny_config))


def test_missing_tensor_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = reference_weights(tiny_config)
    del weights["model.layers.1.mlp.gate_up_proj.weight"]
    del weights["lm_head.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="2 missing tensor") as info:
        load(tmp_path, tiny_config)
    assert "model.layers.1.mlp.gate_up_proj.weight" in str(info.value)
    assert "lm_head.weight" in str(info.value)
    assert "unexpected" not in str(info.value)


def test_untied_model_needs_its_head(tmp_path: Path, tiny_config: ModelConfig) -> None:
    tied_weights = reference_weights(attrs.evolve(tiny_config, tie_word_embeddings=True))
    save_file(tied_weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): lm_head.weight"):
        load(tmp_path, tiny_config)


def base_model_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` as transformers' ``AutoModel`` saves them: no ``model.`` prefix, no head."""
    return {
        name.removeprefix("model."): tensor
        for name, tensor in weights.items()
        if name != "lm_head.weight"
    }


def test_a_base_model_checkpoint_is_told_by_its_names() -> None:
    file = Path("model.safetensors")
    assert is_base_model_checkpoint({file: ["embed_tokens.weight", "norm.weight"]})
    assert not is_base_model_checkpoint({file: ["model.embed_tokens.weight", "lm_head.weight"]})
    assert not is_base_model_checkpoint({file: ["norm.weight", "layers.0.mlp.up_proj.weight"]})
    assert not is_base_model_checkpoint({file: ["embed_tokens.weight", "model.norm.weight"]})


@pytest.mark.parametrize("num_shards", [1, 2])
def test_base_model_checkpoint_with_tied_head_loads(
    tmp_path: Path, tiny_config: ModelConfig, num_shards: int
) -> None:
    tied = attrs.evolve(tiny_config, tie_word_embeddings=True)
    weights = reference_weights(tied)
    stored = base_model_weights(weights)
    assert "embed_tokens.weight" in stored
    if num_shards == 1:
        save_file(stored, str(tmp_path / "model.safetensors"))
    else:
        write_sharded(tmp_path, stored, num_shards)
    model = load(tmp_path, tied)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_loaded(model, weights)


def test_base_model_checkpoint_without_a_tied_head_is_refused_clearly(
    tmp_path: Path, tiny_config: ModelConfig
) -> None:
    save_file(
        base_model_weights(reference_weights(tiny_config)), str(tmp_path / "model.safetensors")
    )
    with pytest.raises(CheckpointError, match=r"base model alone, without lm_head\.weight") as info:
        load(tmp_path, tiny_config)
    assert "tie_word_embeddings false" in str(info.value)


def test_unexpected_tensor_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = reference_weights(tiny_config)
    weights["model.layers.2.self_attn.q_proj.weight"] = torch.zeros(32, 32)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"1 unexpected tensor\(s\): model.layers.2.self_attn.q_proj.weight"
    ):
        load(tmp_path, tiny_config)


def test_misshapen_tensor_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    weights = reference_weights(tiny_config)
    weights["model.norm.weight"] = torch.ones(31)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' has shape \(31,\).*\(32,\)"):
        load(tmp_path, tiny_config)


def test_truncated_file_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    write_sharded(tmp_path, reference_weights(tiny_config), num_shards=2)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002.safetensors: not a readable"):
        load(tmp_path, tiny_config)


def test_garbage_file_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 7 + b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable"):
        load(tmp_path, tiny_config)


def test_missing_shard_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    write_sharded(tmp_path, reference_weights(tiny_config), num_shards=3)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing shard file\(s\): model-00002-of-00003"):
        load(tmp_path, tiny_config)


def test_index_entry_absent_from_its_shard_is_named(
    tmp_path: Path, tiny_config: ModelConfig
) -> None:
    write_sharded(tmp_path, reference_weights(tiny_config), num_shards=2)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.extra.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"model.extra.weight \(model-00001-of-00002.safetensors\)"
    ):
        load(tmp_path, tiny_config)


def test_malformed_index_is_named(tmp_path: Path, tiny_config: ModelConfig) -> None:
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: not a safetensors"):
        load(tmp_path, tiny_config)


def test_pickle_checkpoints_are_never_read(tmp_path: Path, tiny_config: ModelConfig) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle data")
    with pytest.raises(CheckpointError, match=r"neither model.safetensors nor"):
        load(tmp_path, tiny_config)


def test_quantized_checkpoint_is_refused(tmp_path: Path, tiny_config: ModelConfig) -> None:
    save_file(reference_weights(tiny_config), str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="quant_method 'bitsandbytes' is not supported"):
        load(tmp_path, attrs.evolve(tiny_config, quantization_method="bitsandbytes"))


def test_duplicate_tensor_is_refused(tiny_config: ModelConfig) -> None:
    weights = list(reference_weights(tiny_config).items())
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' appears more than once"):
        build_model(
            tiny_config,
            [*weights, ("model.norm.weight", torch.ones(32))],
            LoadOptions(dtype=torch.float32, device="cpu"),
        )


def test_progress_is_off_without_a_terminal_or_when_disabled(tmp_path: Path) -> None:
    primary, replica = os.openpty()
    with os.fdopen(replica, "w") as terminal, (tmp_path / "log").open("w") as log_file:
        assert is_progress_enabled(terminal, environ={})
        assert is_progress_enabled(terminal, environ={"METRALE_NO_PROGRESS": "0"})
        assert not is_progress_enabled(terminal, environ={"METRALE_NO_PROGRESS": "1"})
        assert not is_progress_enabled(terminal, environ={"METRALE_NO_PROGRESS": "true"})
        assert not is_progress_enabled(log_file, environ={})
    os.close(primary)


def test_progress_draws_on_a_terminal_and_is_silent_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("METRALE_NO_PROGRESS", raising=False)
    primary, replica = os.openpty()
    with os.fdopen(replica, "w") as terminal:
        with load_progress(3, "Loading tiny", stream=terminal) as advance:
            for _ in range(3):
                advance(1)
        terminal.flush()
        readable, _, _ = select.select([primary], [], [], 5)
        assert readable
        assert b"Loading tiny" in os.read(primary, 65536)
    os.close(primary)

    log_path = tmp_path / "log"
    with (
        log_path.open("w") as log_file,
        load_progress(3, "Loading tiny", stream=log_file) as advance,
    ):
        advance(3)
    assert log_path.read_text() == ""


def test_progress_observer_hears_every_advance(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    with (
        (tmp_path / "not-a-terminal").open("w") as stream,
        load_progress(
            3, "Loading tiny", stream=stream, on_progress=lambda *p: seen.append(p)
        ) as advance,
    ):
        advance(1)
        advance(2)
    assert seen == [(0, 3), (1, 3), (3, 3)]
