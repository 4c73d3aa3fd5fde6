"""GPTQ's sequential calibration (:mod:`metrale_model_arch.sequential_calibration`) on a tiny
random llama: each layer's Hessian comes from its inputs through the layers (and projections)
rounded before it, each rounding leaves no more error on those inputs than round to nearest, the
writers reproduce the weights rounded in the pass, the checkpoint loads near the float model,
and two runs write the same bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from metrale_testing.greedy import prefill_hidden

from metrale_model_arch import LoadedModel, LoadOptions, load_model
from metrale_model_arch.calibration import Calibration, InputGram, calibration_chunks
from metrale_model_arch.families.llama import LlamaDecoderLayer
from metrale_model_arch.model_source import ModelSource
from metrale_model_arch.quantize import (
    QuantizeMethod,
    QuantizeSpec,
    calibrated_rounding,
    quantize_checkpoint,
    read_float_checkpoint,
    resolve_spec,
)
from metrale_model_arch.sequential_calibration import sequential_hessians

SPECS = {
    "fp8": QuantizeSpec(method=QuantizeMethod.FP8),
    "gptq-g32": QuantizeSpec(method=QuantizeMethod.GPTQ, group_size=32),
    "awq-g32": QuantizeSpec(method=QuantizeMethod.AWQ, group_size=32),
}
NUM_TOKENS = 600  # two chunks: 512 and 88
# The relative logit difference ||calibrated - float|| / ||float|| on the tiny random model
# (weights of standard deviation 0.2, which amplify any rounding), measured: fp8 0.152, gptq-g32
# 0.506, awq-g32 0.451 (round to nearest about the same: random tokens give nearly uncorrelated
# features, so GPTQ has little to compensate through).
RELATIVE_BOUND = {"fp8": 0.25, "gptq-g32": 0.7, "awq-g32": 0.65}
PROMPT_LENGTHS = (5, 17, 40)
# A checkpoint projection -> its fused module and the place of its rows there.
FUSED = {"q": ("qkv_proj", 0), "k": ("qkv_proj", 1), "v": ("qkv_proj", 2), "o": ("o_proj", 0),
         "gate": ("gate_up_proj", 0), "up": ("gate_up_proj", 1),
         "down": ("down_proj", 0)}  # fmt: skip


@pytest.fixture(scope="module")
def calibration(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    """Random tokens of the model's vocabulary, as text."""
    tokenizer = load_model(str(tiny_model_dir)).tokenizer
    tokens = torch.randint(0, tokenizer.vocab_size, (NUM_TOKENS,), generator=seeded(7))
    text = tmp_path_factory.mktemp("calibration") / "calibration.txt"
    text.write_text(tokenizer.decode(tokens.tolist()), encoding="utf-8")
    return Calibration(text_path=text, num_tokens=NUM_TOKENS)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def source_of(path: Path) -> ModelSource:
    return ModelSource(kind="dir", path=path, name=str(path))


def resolved(tiny_model_dir: Path, name: str) -> QuantizeSpec:
    return resolve_spec(read_float_checkpoint(source_of(tiny_model_dir)).config, SPECS[name])


def rounded_pass(
    tiny_model_dir: Path, calibration: Calibration, spec: QuantizeSpec
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The pass's Hessians, and each projection's weight as the pass rounded it."""
    rounding = calibrated_rounding(spec)
    rounded: dict[str, torch.Tensor] = {}

    def recorded(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> torch.Tensor:
        rounded[name] = rounding(name, weight, hessian)
        return rounded[name]

    return sequential_hessians(source_of(tiny_model_dir), calibration, recorded), rounded


def set_rounded(loaded: LoadedModel, rounded: dict[str, torch.Tensor]) -> None:
    """``rounded``'s weights (checkpoint names) into ``loaded``'s fused projections."""
    for name, weight in rounded.items():
        _, _, index, block, projection, _ = name.split(".")
        module, position = FUSED[projection.removesuffix("_proj")]
        layer = loaded.model.model.layers[int(index)]
        fused = getattr(getattr(layer, block), module).weight
        if module == "qkv_proj":
            sizes = layer.self_attn.qkv_split
        else:
            sizes = (fused.shape[0] // (2 if module == "gate_up_proj" else 1),) * 2
        start = sum(sizes[:position])
        with torch.no_grad():
            fused[start : start + sizes[position]] = weight


def float_model_hessian(
    tiny_model_dir: Path,
    calibration: Calibration,
    module: str,
    rounded_before: dict[str, torch.Tensor],
) -> torch.Tensor:
    """The Hessian of ``module``'s input, the float model reading the calibration chunks with
    ``rounded_before``'s weights in place."""
    loaded = load_model(str(tiny_model_dir))
    set_rounded(loaded, rounded_before)
    gram = InputGram(num_features=loaded.model.get_submodule(module).in_features)
    handle = loaded.model.get_submodule(module).register_forward_pre_hook(gram.add)
    try:
        for chunk in calibration_chunks(loaded.tokenizer, calibration):
            prefill_hidden(loaded, chunk)
    finally:
        handle.remove()
    return gram.hessian


@pytest.mark.parametrize("name", list(SPECS))
def test_each_hessian_comes_through_what_was_rounded_before_it(
    tiny_model_dir: Path, calibration: Calibration, name: str
) -> None:
    hessians, rounded = rounded_pass(tiny_model_dir, calibration, resolved(tiny_model_dir, name))
    layer0 = [n for n in rounded if n.startswith("model.layers.0.")]
    cases = [
        # layer 0's o_proj reads q/k/v rounded; layer 1's q/k/v read all of layer 0 rounded.
        ("model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.o_proj.weight",
         [n for n in layer0 if ".self_attn.o_proj" not in n and ".self_attn." in n]),
        ("model.layers.1.self_attn.qkv_proj", "model.layers.1.self_attn.q_proj.weight",
         layer0),
    ]  # fmt: skip
    for module, weight_name, before in cases:
        expected = float_model_hessian(
            tiny_model_dir, calibration, module, {n: rounded[n] for n in before}
        )
        torch.testing.assert_close(hessians[weight_name], expected, rtol=1e-4, atol=1e-5)
        float_only = float_model_hessian(tiny_model_dir, calibration, module, {})
        assert not torch.allclose(hessians[weight_name], float_only, rtol=1e-4, atol=1e-5)
    assert (
        hessians["model.layers.1.self_attn.q_proj.weight"]
        is hessians["model.layers.1.self_attn.v_proj.weight"]
    )


@pytest.mark.parametrize("name", list(SPECS))
def test_each_rounding_leaves_no_more_error_on_its_inputs_than_round_to_nearest(
    tiny_model_dir: Path, calibration: Calibration, name: str
) -> None:
    """On the inputs each projection saw (its Hessian ``H``), ``tr(D H D^T)`` of the rounding
    error ``D``: GPTQ's against round to nearest's (GPTQ with a diagonal ``H``)."""
    spec = resolved(tiny_model_dir, name)
    hessians, rounded = rounded_pass(tiny_model_dir, calibration, spec)
    floats = dict(read_float_checkpoint(source_of(tiny_model_dir)).weights)
    rounding = calibrated_rounding(spec)
    assert len(rounded) == 2 * 7
    totals = [0.0, 0.0]
    for weight_name, gptq in rounded.items():
        weight, hessian = floats[weight_name].float(), hessians[weight_name]
        nearest = rounding(weight_name, weight, torch.eye(hessian.shape[0]))
        gptq_error, nearest_error = (
            float(torch.einsum("ij,jk,ik->", d.double(), hessian.double(), d.double()))
            for d in (weight - gptq, weight - nearest)
        )
        assert gptq_error <= nearest_error, weight_name
        totals[0] += gptq_error
        totals[1] += nearest_error
    print(f"{name}: error on the calibration inputs {totals[0]:.4g} against {totals[1]:.4g}")
    assert totals[0] < totals[1]


def test_the_writer_reproduces_the_weights_the_pass_rounded(
    tiny_model_dir: Path, calibration: Calibration, tmp_path: Path
) -> None:
    _, rounded = rounded_pass(tiny_model_dir, calibration, resolved(tiny_model_dir, "fp8"))
    spec = QuantizeSpec(method=QuantizeMethod.FP8, calibration=calibration)
    out = quantize_checkpoint(source_of(tiny_model_dir), tmp_path / "fp8", spec).out
    written = load_model(str(out), LoadOptions(dtype=torch.float32))
    reference = load_model(str(tiny_model_dir))
    set_rounded(reference, rounded)
    for (name, got), (_, want) in zip(
        written.model.named_parameters(), reference.model.named_parameters(), strict=True
    ):
        if name.endswith("_proj.weight"):
            assert torch.equal(got, want), name


@pytest.mark.parametrize("name", list(SPECS))
def test_the_calibrated_checkpoint_loads_near_the_float_model_and_is_deterministic(
    tiny_model_dir: Path, calibration: Calibration, tmp_path: Path, name: str
) -> None:
    spec = QuantizeSpec(
        method=SPECS[name].method, group_size=SPECS[name].group_size, calibration=calibration
    )
    outs = [
        quantize_checkpoint(source_of(tiny_model_dir), tmp_path / f"run{run}", spec).out
        for run in range(2)
    ]
    digests = [
        {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.glob("*.safetensors")}
        for out in outs
    ]
    assert digests[0] == digests[1]
    quantized = load_model(str(outs[0]), LoadOptions(dtype=torch.float32))
    reference = load_model(str(tiny_model_dir))
    prompts = [
        torch.randint(0, reference.config.vocab_size, (n,), generator=seeded(n)).tolist()
        for n in PROMPT_LENGTHS
    ]
    with torch.inference_mode():
        got = torch.cat(
            [quantized.model.compute_logits(prefill_hidden(quantized, p)) for p in prompts]
        )
        want = torch.cat(
            [reference.model.compute_logits(prefill_hidden(reference, p)) for p in prompts]
        )
    relative = float((got - want).norm() / want.norm())
    print(f"{name}: relative logit difference {relative:.3f}")
    assert relative < RELATIVE_BOUND[name]
    assert isinstance(quantized.model.model.layers[0], LlamaDecoderLayer)
