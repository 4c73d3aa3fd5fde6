"""AWQ and GPTQ int4 checkpoints (:mod:`metrale_model_arch.loading.int4_checkpoints`), built here
in each public layout by our own packer (``metrale_testing.int4_checkpoints``): the weights read
exactly as the layout says, their q4 blocks within the float16 rounding of ``m = -z * s``, the
q4 model's logits and greedy tokens against the float32 model of the dequantized weights, and
the plan equal to what was allocated, owner by owner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import torch
from metrale_testing.int4_checkpoints import save_int4_llama
from metrale_testing.recording_allocator import RecordingAllocator
from safetensors.torch import load_file, save_file

from metrale_config import model_config_from_hf_file
from metrale_kernels import dequantize_q4, dequantize_rows
from metrale_kernels.reference.q4_matmul import block_scales
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.int4_layers import OrderedQ4Linear
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_model_arch.families.q4_layers import Q4Linear
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.parallel.shard import TensorShard
from metrale_model_arch.weight_format import Quantization

if TYPE_CHECKING:
    from .conftest import PagedRunner

CASES: dict[str, dict[str, Any]] = {
    "awq-g32": {"method": "awq", "group_size": 32},
    "awq-g64": {"method": "awq", "group_size": 64},
    "gptq-sym-g32": {"method": "gptq", "group_size": 32, "sym": True},
    "gptq-asym-g64": {"method": "gptq", "group_size": 64, "sym": False},
    "gptq-desc-act-g32": {"method": "gptq", "group_size": 32, "sym": False, "desc_act": True},
}
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
NUM_PROMPTS = 8
NUM_TOKENS = 32
# Measured (RTN of random weights, seed 0; prefill of 8 prompts, logits up to ~10.7): largest
# logit difference from the float32 model of the weights q4 holds 0.040 (awq-g32), 0.027
# (awq-g64, gptq-asym-g64: the same levels), 0.0033 (gptq-sym-g32: every m exact), 0.023
# (gptq-desc-act-g32); with m = -z * s alone (no flipped blocks) 0.074, 0.053, 0.0033, 0.044.
LOGIT_BOUND = 0.08
# 32 greedy tokens identical on 8, 7, 8, 7, 7 of the 8 prompts (37 of 40).
MIN_IDENTICAL_PROMPTS = 6
# q4's int8 embeddings and head against the checkpoint's float16 ones: measured 0.032-0.036.
CHECKPOINT_RELATIVE_BOUND = 0.06


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    checkpoints = {}
    for case, kwargs in CASES.items():
        for levels in ("rtn", "random"):
            path = tmp_path_factory.mktemp(f"{case}-{levels}")
            checkpoints[f"{case}/{levels}"] = (path, save_int4_llama(path, levels=levels, **kwargs))
    return checkpoints


def load(
    path: Path, quantization: Quantization, ledger: RecordingAllocator | None = None, **options: Any
) -> LlamaForCausalLM:
    config = model_config_from_hf_file(path)
    model = load_safetensors_model(
        path,
        config,
        LoadOptions(
            dtype=torch.float32,
            quantization=quantization,
            allocator=ledger or RecordingAllocator(),
            **options,
        ),
    )
    assert isinstance(model, LlamaForCausalLM)
    return model


def float_model(path: Path, weights: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """The float32 model of the checkpoint's weights as its layout says they are."""
    config = attrs.evolve(
        model_config_from_hf_file(path), int4_quantization=None, quantization_method=None
    )
    model = build_model(config, weights.items(), LoadOptions(dtype=torch.float32))
    assert isinstance(model, LlamaForCausalLM)
    return model


def fused_truth(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A fused projection's matrix (``model.layers.0.self_attn.qkv_proj``) from its parts."""
    prefix, _, fused = name.rpartition(".")
    parts = FUSED.get(fused, (fused,))
    return torch.cat([weights[f"{prefix}.{part}.weight"] for part in parts])


@pytest.mark.parametrize("case", list(CASES))
def test_the_weights_read_are_the_layouts_exactly(
    saved: dict[str, tuple[Path, dict[str, Any]]], case: str
) -> None:
    path, weights = saved[f"{case}/random"]
    loaded = load(path, Quantization.NONE).state_dict()
    expected = float_model(path, weights).state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("case", list(CASES))
def test_q4_blocks_are_the_weights_up_to_m_in_float16(
    saved: dict[str, tuple[Path, dict[str, Any]]], case: str
) -> None:
    """``(d, q, m)`` = ``(s, q, -z * s)`` or ``(-s, 15 - q, (15 - z) * s)``, ``m`` rounded to
    float16: each weight off by at most ``|m| * 2**-11`` (measured on random levels: at most
    0.0025 of its step ``s``), none for GPTQ's symmetric ``z = 8``."""
    path, weights = saved[f"{case}/random"]
    model = load(path, Quantization.Q4)
    largest = 0.0
    for name, module in model.named_modules():
        if not isinstance(module, Q4Linear):
            continue
        assert isinstance(module, OrderedQ4Linear) == CASES[case].get("desc_act", False)
        truth = fused_truth(weights, name)
        if isinstance(module, OrderedQ4Linear):
            truth = truth[:, module.input_order]
        held = dequantize_q4(module.packed, module.scales)
        step, minimum = block_scales(module.scales)
        error = (held - truth).abs()
        assert bool((error <= minimum.abs().repeat_interleave(32, dim=1) * 2.0**-11).all()), name
        largest = max(largest, float((error / step.repeat_interleave(32, dim=1)).max()))
    print(f"{case}: largest weight error {largest:.5f} of its step s")
    assert largest <= 16 * 2.0**-11
    symmetric_path, symmetric_weights = saved["gptq-sym-g32/rtn"]
    for name, module in load(symmetric_path, Quantization.Q4).named_modules():
        if isinstance(module, Q4Linear):
            held = dequantize_q4(module.packed, module.scales)
            assert torch.equal(held, fused_truth(symmetric_weights, name)), name


def greedy(runner: PagedRunner, prompts: list[list[int]]) -> tuple[torch.Tensor, list[list[int]]]:
    """The prompts' prefill logits (concatenated) and each one's 32 greedy tokens."""
    logits = runner.step(dict(enumerate(prompts)))
    first = torch.cat([logits[i] for i in range(len(prompts))])
    tokens = [[int(logits[i][-1].argmax())] for i in range(len(prompts))]
    for _ in range(NUM_TOKENS - 1):
        logits = runner.step({i: [tokens[i][-1]] for i in range(len(prompts))})
        for i in range(len(prompts)):
            tokens[i].append(int(logits[i][-1].argmax()))
    return first, tokens


def int8_tables(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The values q4's int8 embeddings and head hold, under their checkpoint names."""
    embeddings, head = model.model.embed_tokens, model.lm_head
    assert isinstance(embeddings, Int8Embedding)
    assert isinstance(head, Int8Linear)
    return {
        "model.embed_tokens.weight": dequantize_rows(embeddings.qweight, embeddings.scale),
        "lm_head.weight": dequantize_rows(head.qweight, head.scale),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_the_q4_model_runs_as_the_float_model_of_its_weights(
    saved: dict[str, tuple[Path, dict[str, Any]]],
    case: str,
    paged_runner: type[PagedRunner],
) -> None:
    """Against the float32 model of the weights q4 holds (the checkpoint's projections, the
    int8 embeddings' and head's values): only ``m``'s float16 rounding and the activations'
    two-digit rounding part them. Against the checkpoint's float embeddings and head, q4's
    int8 tables add their own error (its cost for a GGUF too), bounded apart."""
    path, weights = saved[f"{case}/rtn"]
    generator = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(0, 256, (int(length),), generator=generator).tolist()
        for length in torch.randint(4, 20, (NUM_PROMPTS,), generator=generator)
    ]
    model = load(path, Quantization.Q4)
    held = float_model(path, {**weights, **int8_tables(model)})
    runs = [greedy(paged_runner(m, num_blocks=64, block_size=8), prompts) for m in (held, model)]
    (expected_logits, expected_tokens), (logits, tokens) = runs
    checkpoint_run = paged_runner(float_model(path, weights), num_blocks=64, block_size=8)
    checkpoint_logits = torch.cat(list(checkpoint_run.step(dict(enumerate(prompts))).values()))
    difference = float((logits - expected_logits).abs().max())
    identical = sum(a == b for a, b in zip(tokens, expected_tokens, strict=True))
    relative = float((logits - checkpoint_logits).norm() / checkpoint_logits.norm())
    print(
        f"{case}: max |logit diff| {difference:.5f} (largest logit "
        f"{float(expected_logits.abs().max()):.2f}), {identical}/{NUM_PROMPTS} identical; "
        f"against the checkpoint's float tables relative {relative:.4f}"
    )
    assert difference < LOGIT_BOUND
    assert identical >= MIN_IDENTICAL_PROMPTS
    assert relative < CHECKPOINT_RELATIVE_BOUND


@pytest.mark.parametrize("quantization", [Quantization.NONE, Quantization.INT8, Quantization.Q4])
@pytest.mark.parametrize("case", list(CASES))
def test_the_plan_is_the_ledger_by_owner(
    saved: dict[str, tuple[Path, dict[str, Any]]], case: str, quantization: Quantization
) -> None:
    path, _ = saved[f"{case}/rtn"]
    ledger = RecordingAllocator()
    load(path, quantization, ledger)
    config = model_config_from_hf_file(path)
    plan = weight_bytes(config, 4, quantization).by_owner()
    weights = {
        owner: size for owner, size in ledger.bytes_by_owner.items() if owner.startswith("weights.")
    }
    assert weights == {owner: size for owner, size in plan.items() if size}


def rewrite(path: Path, change: Any) -> None:
    """Apply ``change(tensors)`` to the checkpoint's tensors in place."""
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_parts_of_one_projection_in_different_shards_load(
    saved: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path
) -> None:
    path, weights = saved["gptq-desc-act-g32/random"]
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for shard in range(3):  # qweight, qzeros, scales and g_idx of a projection: 3 files
        filename = f"model-{shard + 1:05d}-of-00003.safetensors"
        save_file({name: tensors[name] for name in names[shard::3]}, str(tmp_path / filename))
        weight_map.update(dict.fromkeys(names[shard::3], filename))
    index = {"metadata": {}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    loaded = load(tmp_path, Quantization.NONE).state_dict()
    for name, tensor in float_model(path, weights).state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    save_int4_llama(tmp_path, method="awq", group_size=32)
    rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.qzeros"))
    with pytest.raises(CheckpointError, match=r"model.layers.1.mlp.up_proj lacks qzeros"):
        load(tmp_path, Quantization.Q4)


def test_misshapen_scales_are_named(tmp_path: Path) -> None:
    save_int4_llama(tmp_path, method="gptq", group_size=32)
    name = "model.layers.0.self_attn.o_proj.scales"
    rewrite(tmp_path, lambda t: t.update({name: t[name][:1]}))
    with pytest.raises(CheckpointError, match=r"o_proj.scales: shape \(1, 64\)"):
        load(tmp_path, Quantization.NONE)


def test_an_unordered_g_idx_without_desc_act_is_refused(tmp_path: Path) -> None:
    save_int4_llama(tmp_path, method="gptq", group_size=32)
    name = "model.layers.0.mlp.down_proj.g_idx"
    rewrite(tmp_path, lambda t: t.update({name: t[name].flip(0).contiguous()}))
    with pytest.raises(CheckpointError, match=r"down_proj.g_idx: not in order .* desc_act"):
        load(tmp_path, Quantization.Q4)


def test_fused_parts_with_different_orders_are_refused(tmp_path: Path) -> None:
    """One input cannot be gathered two ways: q and k given different act-orders."""
    save_int4_llama(tmp_path, method="gptq", group_size=32, desc_act=True)
    prefix = "model.layers.0.self_attn"

    def swap_k_order(tensors: dict[str, torch.Tensor]) -> None:
        tensors[f"{prefix}.k_proj.g_idx"] = torch.arange(64, dtype=torch.int32) // 32

    rewrite(tmp_path, swap_k_order)
    with pytest.raises(ValueError, match="different g_idx orders"):
        load(tmp_path, Quantization.Q4)
    load(tmp_path, Quantization.NONE)  # dequantized, each part in its own order


def test_a_split_over_ranks_is_refused(tmp_path: Path) -> None:
    save_int4_llama(tmp_path, method="awq", group_size=32)
    shard = TensorShard(rank=0, world_size=2)
    with pytest.raises(CheckpointError, match="not split across ranks"):
        load(tmp_path, Quantization.Q4, shard=shard)


def test_groups_that_are_not_whole_blocks_are_refused(tmp_path: Path) -> None:
    save_int4_llama(tmp_path, method="awq", group_size=32)
    config = model_config_from_hf_file(tmp_path)
    assert config.int4_quantization is not None
    config = attrs.evolve(
        config, int4_quantization=attrs.evolve(config.int4_quantization, group_size=16)
    )
    with pytest.raises(CheckpointError, match="group_size 16: groups must be whole q4 blocks"):
        load_safetensors_model(tmp_path, config, LoadOptions())
    with pytest.raises(ValueError, match="group_size 16"):
        weight_bytes(config, 4, Quantization.Q4)
