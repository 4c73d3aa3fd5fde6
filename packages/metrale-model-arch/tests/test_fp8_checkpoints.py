"""FP8 e4m3 checkpoints (:mod:`metrale_model_arch.loading.fp8_checkpoints`), written in each
public layout by our own quantizer (``metrale_testing.fp8_checkpoints``) from tiny random
llama, qwen3 and qwen3_moe models (experts quantized too): the weights read exactly as the
layout says, the model's logits and greedy tokens against the float32 model of those
dequantized weights (and, as fp8's own cost, against the float model it was quantized from),
the plan equal to what was allocated, and every malformed part named."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import torch
from metrale_testing.fp8_checkpoints import LAYOUTS, convert_to_fp8
from metrale_testing.recording_allocator import RecordingAllocator
from safetensors.torch import load_file, save_file

from metrale_config import model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import build_model
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.loading.errors import CheckpointError
from metrale_model_arch.loading.fp8_checkpoints import fp8_checkpoint_tensors
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.parallel.shard import TensorShard
from metrale_model_arch.weight_format import Quantization

if TYPE_CHECKING:
    from .conftest import PagedRunner

transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 256
SMALL = {"vocab_size": VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 256, "tie_word_embeddings": False}  # fmt: skip
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"intermediate_size": 128}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"intermediate_size": 96}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "intermediate_size": 96,
            "moe_intermediate_size": 40,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
}
CASES = [
    *(("llama", layout) for layout in LAYOUTS),
    ("qwen3", "fp8-block"),
    ("qwen3", "ct-tensor"),
    ("qwen3", "ct-channel-static"),
    ("qwen3_moe", "fp8-block"),
    ("qwen3_moe", "ct-channel"),
    ("qwen3_moe", "ct-block"),
]
CASE_IDS = [f"{family}/{layout}" for family, layout in CASES]
NUM_PROMPTS = 8
NUM_TOKENS = 32
# Measured: the fp8 model's logits equal the float32 model's of the same dequantized weights
# bit for bit (largest difference 0.0 in all 13 cases): the same float32 products reach the
# same kernels. The bound leaves room for a kernel that reassociates.
RELATIVE_LOGIT_BOUND = 1e-5
# fp8's own cost against the float model it was quantized from (each weight off by ~2.6% RMS):
# measured relative logit error 0.12-0.13 (llama), 0.10 (qwen3), 0.19-0.20 (qwen3_moe), and no
# prompt's 32 greedy tokens identical. These random models amplify any weight error (bf16
# rounding alone, 0.2% RMS: 0.012 and 5 of 8 prompts); the bench measures fp8 on a real one.
QUANTIZATION_RELATIVE_BOUND = 0.25


@attrs.frozen(kw_only=True)
class Saved:
    float_path: Path
    path: Path
    expected: dict[str, torch.Tensor]


def save_float(family: str, path: Path, seed: int = 0) -> Path:
    """A tiny random ``family`` model, saved as transformers saves it (float32)."""
    config_class, model_class, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**SMALL, **extra)
    model = getattr(transformers, model_class)(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Saved]:
    floats = {family: save_float(family, tmp_path_factory.mktemp(family)) for family in FAMILIES}
    checkpoints = {}
    for case_id, (family, layout) in zip(CASE_IDS, CASES, strict=True):
        path = tmp_path_factory.mktemp(case_id.replace("/", "-"))
        expected = convert_to_fp8(floats[family], path, LAYOUTS[layout])
        checkpoints[case_id] = Saved(float_path=floats[family], path=path, expected=expected)
    return checkpoints


def load(
    path: Path,
    quantization: Quantization = Quantization.NONE,
    ledger: RecordingAllocator | None = None,
    dtype: torch.dtype = torch.float32,
    **options: Any,
) -> CausalLM:
    allocator = ledger or RecordingAllocator()
    options = {"dtype": dtype, "quantization": quantization, "allocator": allocator, **options}
    return load_safetensors_model(path, model_config_from_hf_file(path), LoadOptions(**options))


def float_model(path: Path, weights: dict[str, torch.Tensor]) -> CausalLM:
    """The float32 model of ``weights`` under ``path``'s config, without its quantization."""
    config = attrs.evolve(
        model_config_from_hf_file(path), fp8_quantization=None, quantization_method=None
    )
    return build_model(config, weights.items(), LoadOptions(dtype=torch.float32))


@pytest.mark.parametrize("case", CASE_IDS)
def test_the_weights_read_are_the_layouts_exactly(saved: dict[str, Saved], case: str) -> None:
    checkpoint = saved[case]
    config = model_config_from_hf_file(checkpoint.path)
    assert config.fp8_quantization is not None
    assert config.fp8_quantization.granularities == (LAYOUTS[case.split("/")[1]].granularity,)
    loaded = load(checkpoint.path).state_dict()
    expected = float_model(checkpoint.path, checkpoint.expected).state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_the_serve_dtype_holds_the_dequantized_weights(saved: dict[str, Saved]) -> None:
    checkpoint = saved["qwen3_moe/fp8-block"]
    model = load(checkpoint.path, dtype=torch.bfloat16)
    experts = model.model.layers[0].mlp.experts
    assert experts.down_proj.dtype == torch.bfloat16
    expected = checkpoint.expected["model.layers.0.mlp.experts.5.down_proj.weight"]
    assert torch.equal(experts.down_proj[5], expected.to(torch.bfloat16))


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


@pytest.mark.parametrize("case", CASE_IDS)
def test_the_model_runs_as_the_float_model_of_its_weights(
    saved: dict[str, Saved], case: str, paged_runner: type[PagedRunner]
) -> None:
    checkpoint = saved[case]
    generator = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(0, VOCAB_SIZE, (int(length),), generator=generator).tolist()
        for length in torch.randint(4, 20, (NUM_PROMPTS,), generator=generator)
    ]
    models = {
        "fp8": load(checkpoint.path),
        "dequantized": float_model(checkpoint.path, checkpoint.expected),
        "original": load(checkpoint.float_path),
    }
    runs = {
        name: greedy(paged_runner(model, num_blocks=64, block_size=8), prompts)
        for name, model in models.items()
    }
    (logits, tokens), (expected_logits, expected_tokens) = runs["fp8"], runs["dequantized"]
    original_logits, original_tokens = runs["original"]
    relative = float((logits - expected_logits).norm() / expected_logits.norm())
    identical = sum(a == b for a, b in zip(tokens, expected_tokens, strict=True))
    cost = float((logits - original_logits).norm() / original_logits.norm())
    kept = sum(a == b for a, b in zip(tokens, original_tokens, strict=True))
    print(
        f"{case}: relative logit difference {relative:.2e} (max "
        f"{float((logits - expected_logits).abs().max()):.2e}), {identical}/{NUM_PROMPTS} "
        f"identical; against the original float model relative {cost:.4f}, "
        f"{kept}/{NUM_PROMPTS} identical"
    )
    assert relative < RELATIVE_LOGIT_BOUND
    assert identical == NUM_PROMPTS
    assert cost < QUANTIZATION_RELATIVE_BOUND
    assert len({t for sequence in tokens for t in sequence}) >= 16, "degenerate model"


@pytest.mark.parametrize(
    ("case", "quantization", "dtype"),
    [
        *((case, Quantization.NONE, torch.float32) for case in CASE_IDS),
        ("llama/fp8-block", Quantization.NONE, torch.bfloat16),
        ("qwen3_moe/ct-block", Quantization.NONE, torch.bfloat16),
        ("llama/fp8-block", Quantization.INT8, torch.float32),
        ("llama/ct-channel", Quantization.Q4, torch.float32),
    ],
)
def test_the_plan_is_the_ledger_by_owner(
    saved: dict[str, Saved], case: str, quantization: Quantization, dtype: torch.dtype
) -> None:
    """The scales are read and dropped: the model holds the float (or int8, q4) weights alone,
    priced as a float checkpoint's."""
    path = saved[case].path
    ledger = RecordingAllocator()
    load(path, quantization, ledger, dtype=dtype)
    config = model_config_from_hf_file(path)
    plan = weight_bytes(config, dtype.itemsize, quantization).by_owner()
    weights = {
        owner: size for owner, size in ledger.bytes_by_owner.items() if owner.startswith("weights.")
    }
    assert weights == {owner: size for owner, size in plan.items() if size}
    float_config = model_config_from_hf_file(saved[case].float_path)
    assert plan == weight_bytes(float_config, dtype.itemsize, quantization).by_owner()


def test_one_dequantized_weight_is_alive_at_a_time(saved: dict[str, Saved]) -> None:
    """Each dequantized weight is gone once the consumer lets it go: the stream keeps none."""
    checkpoint = saved["qwen3_moe/fp8-block"]
    config = model_config_from_hf_file(checkpoint.path)
    stored = load_file(str(checkpoint.path / "model.safetensors"))
    alive: list[weakref.ref[torch.Tensor]] = []
    num_dequantized = 0
    for name, tensor in fp8_checkpoint_tensors(iter(sorted(stored.items())), config):
        if name in stored and tensor is stored[name]:
            continue
        num_dequantized += 1
        alive.append(weakref.ref(tensor))
        del tensor
        gc.collect()
        assert sum(ref() is not None for ref in alive) == 0
    assert num_dequantized == sum(name.endswith("_scale_inv") for name in stored)


def rewrite(path: Path, change: Any) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.fixture
def fresh(saved: dict[str, Saved], tmp_path: Path) -> tuple[Path, Path]:
    """A block and a compressed-tensors channel checkpoint of llama, to break."""
    source = saved["llama/fp8-block"].float_path
    block, channel = tmp_path / "block", tmp_path / "channel"
    convert_to_fp8(source, block, LAYOUTS["fp8-block"])
    convert_to_fp8(source, channel, LAYOUTS["ct-channel"])
    return block, channel


def test_a_weight_and_its_scale_in_different_shards_load(
    saved: dict[str, Saved], tmp_path: Path
) -> None:
    checkpoint = saved["qwen3_moe/ct-block"]
    layout = LAYOUTS["ct-block"]
    expected = convert_to_fp8(checkpoint.float_path, tmp_path, layout, max_shard_bytes=1)
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    scaled = [name for name in weight_map if name.endswith(layout.scale_name)]
    assert scaled
    for scale in scaled:  # a file a tensor
        assert weight_map[scale] != weight_map[scale.replace(layout.scale_name, "weight")]
    loaded = load(tmp_path).state_dict()
    for name, tensor in float_model(tmp_path, expected).state_dict().items():
        assert torch.equal(loaded[name], tensor), name


LAYER = "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize(
    ("which", "change", "message"),
    [
        ("block", lambda t: t.pop(f"{LAYER}.weight_scale_inv"), rf"{LAYER} lacks weight_scale_inv"),
        ("channel", lambda t: t.pop(f"{LAYER}.weight"), rf"{LAYER} lacks its fp8 weight"),
        (
            "block",
            lambda t: t.update({f"{LAYER}.weight_scale_inv": t[f"{LAYER}.weight_scale_inv"][:1]}),
            r"down_proj.weight_scale_inv: shape \(1, 3\), fp8 weights \(block 32x48\) with "
            r"weight \(64, 128\) means \(2, 3\)",
        ),
        (
            "channel",
            lambda t: t.update({f"{LAYER}.weight_scale": t[f"{LAYER}.weight_scale"].t()}),
            r"down_proj.weight_scale: shape \(1, 64\), .* means \(64, 1\)",
        ),
        (
            "channel",
            lambda t: t.update({f"{LAYER}.weight": t[f"{LAYER}.weight"].to(torch.float8_e5m2)}),
            r"down_proj.weight: torch.float8_e5m2 is not read \(only float8_e4m3fn\)",
        ),
        (
            "channel",
            lambda t: t.update({f"{LAYER}.weight_zero_point": torch.ones(64, 1, dtype=torch.int8)}),
            r"weight_zero_point: non-zero zero points",
        ),
        (
            "block",
            lambda t: t.update(
                {"model.norm.weight": t["model.norm.weight"].to(torch.float8_e4m3fn)}
            ),
            r"fp8 weights \(block 32x48\): model.norm lacks weight_scale_inv",
        ),
    ],
)
def test_malformed_parts_are_named(
    fresh: tuple[Path, Path], which: str, change: Any, message: str
) -> None:
    block, channel = fresh
    path = block if which == "block" else channel
    rewrite(path, change)
    with pytest.raises(CheckpointError, match=message):
        load(path)


def test_zero_points_of_zero_are_accepted(fresh: tuple[Path, Path]) -> None:
    _, channel = fresh
    rewrite(channel, lambda t: t.update({f"{LAYER}.weight_zero_point": torch.zeros(64, 1)}))
    load(channel)


def test_a_split_over_ranks_is_refused(fresh: tuple[Path, Path]) -> None:
    block, _ = fresh
    with pytest.raises(CheckpointError, match="fp8 checkpoints are not split across ranks"):
        load(block, shard=TensorShard(rank=0, world_size=2))
