"""GPTQ's sequential calibration (:mod:`metrale_model_arch.sequential_calibration`) on a tiny
random llama: each layer's Hessian comes from its inputs through the layers (and projections)
rounded before it, each rounding leaves no more error on those inputs than round to nearest, the
writers write the weights rounded in the pass (GPTQ run once a projection: the tensors a second
rounding with the pass's Hessians wrote before), the checkpoint loads near the float model, two
runs write the same bytes, and act-order's checkpoint serves as the float model of its levels."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import attrs
import pytest
import torch
from metrale_testing.greedy import prefill_hidden
from safetensors.torch import load_file

from metrale_config import Int4Method
from metrale_kernels import dequantize_rows
from metrale_model_arch import LoadedModel, LoadOptions, load_model
from metrale_model_arch.calibration import Calibration, InputGram, calibration_chunks
from metrale_model_arch.families.int4_layers import OrderedQ4Linear
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.llama import LlamaDecoderLayer
from metrale_model_arch.fp8_quantize import gptq_fp8
from metrale_model_arch.int4_gptq import gptq_int4
from metrale_model_arch.int4_quantize import pack_int4
from metrale_model_arch.model_source import ModelSource
from metrale_model_arch.quantize import (
    QuantizeMethod,
    QuantizeSpec,
    calibrated_rounding,
    quantize_checkpoint,
    read_float_checkpoint,
    resolve_spec,
)
from metrale_model_arch.sequential_calibration import RoundedWeight, sequential_rounding
from metrale_model_arch.weight_format import Quantization

SPECS = {
    "fp8": QuantizeSpec(method=QuantizeMethod.FP8),
    "gptq-g32": QuantizeSpec(method=QuantizeMethod.GPTQ, group_size=32),
    "gptq-act-g32": QuantizeSpec(method=QuantizeMethod.GPTQ, group_size=32, is_act_order=True),
    "awq-g32": QuantizeSpec(method=QuantizeMethod.AWQ, group_size=32),
}
NUM_TOKENS = 600  # two chunks: 512 and 88
# The relative logit difference ||calibrated - float|| / ||float|| on the tiny random model
# (weights of standard deviation 0.2, which amplify any rounding), measured: fp8 0.152, gptq-g32
# 0.506, gptq-act-g32 0.509, awq-g32 0.451 (round to nearest about the same: random tokens give
# nearly uncorrelated features, so GPTQ has little to compensate through).
RELATIVE_BOUND = {"fp8": 0.25, "gptq-g32": 0.7, "gptq-act-g32": 0.7, "awq-g32": 0.65}
# The q4 model of the act-order checkpoint against the float32 model of the weights it holds
# (the levels, q4's int8 embeddings and head): the bound of test_int4_checkpoints.
LOGIT_BOUND = 0.08
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


def resolved(tiny_model_dir: Path, name: str, calibration: Calibration) -> QuantizeSpec:
    spec = attrs.evolve(SPECS[name], calibration=calibration)
    return resolve_spec(read_float_checkpoint(source_of(tiny_model_dir)).config, spec)


def rounded_pass(
    tiny_model_dir: Path, calibration: Calibration, spec: QuantizeSpec
) -> tuple[dict[str, torch.Tensor], dict[str, RoundedWeight]]:
    """The Hessian each projection was rounded with in the pass, and its rounding."""
    rounding = calibrated_rounding(spec)
    hessians: dict[str, torch.Tensor] = {}

    def recorded(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> RoundedWeight:
        hessians[name] = hessian
        return rounding(name, weight, hessian)

    return hessians, sequential_rounding(source_of(tiny_model_dir), calibration, recorded)


def dequantized(rounded: dict[str, RoundedWeight]) -> dict[str, torch.Tensor]:
    return {name: weight.dequantized() for name, weight in rounded.items()}


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
    spec = resolved(tiny_model_dir, name, calibration)
    hessians, stored = rounded_pass(tiny_model_dir, calibration, spec)
    rounded = dequantized(stored)
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
    spec = resolved(tiny_model_dir, name, calibration)
    hessians, stored = rounded_pass(tiny_model_dir, calibration, spec)
    rounded = dequantized(stored)
    floats = dict(read_float_checkpoint(source_of(tiny_model_dir)).weights)
    rounding = calibrated_rounding(spec)
    assert len(rounded) == 2 * 7
    totals = [0.0, 0.0]
    for weight_name, gptq in rounded.items():
        weight, hessian = floats[weight_name].float(), hessians[weight_name]
        nearest = rounding(weight_name, weight, torch.eye(hessian.shape[0])).dequantized()
        gptq_error, nearest_error = (
            float(torch.einsum("ij,jk,ik->", d.double(), hessian.double(), d.double()))
            for d in (weight - gptq, weight - nearest)
        )
        assert gptq_error <= nearest_error, weight_name
        totals[0] += gptq_error
        totals[1] += nearest_error
    print(f"{name}: error on the calibration inputs {totals[0]:.4g} against {totals[1]:.4g}")
    assert totals[0] < totals[1]


@pytest.mark.parametrize("name", ["fp8", "gptq-g32", "gptq-act-g32"])
def test_the_writer_writes_the_weights_the_pass_rounded(
    tiny_model_dir: Path, calibration: Calibration, tmp_path: Path, name: str
) -> None:
    spec = resolved(tiny_model_dir, name, calibration)
    _, stored = rounded_pass(tiny_model_dir, calibration, spec)
    out = quantize_checkpoint(source_of(tiny_model_dir), tmp_path / name, spec).out
    written = load_model(str(out), LoadOptions(dtype=torch.float32))
    reference = load_model(str(tiny_model_dir))
    set_rounded(reference, dequantized(stored))
    for (name, got), (_, want) in zip(
        written.model.named_parameters(), reference.model.named_parameters(), strict=True
    ):
        if name.endswith("_proj.weight"):
            assert torch.equal(got, want), name


@pytest.mark.parametrize("name", ["fp8", "gptq-g32", "awq-g32"])
def test_each_projection_is_rounded_once_into_the_tensors_a_second_rounding_wrote(
    tiny_model_dir: Path,
    calibration: Calibration,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    """The writer used to GPTQ-round each projection again with the pass's Hessian: the pass's
    rounding written instead is the same tensors, in one GPTQ run a projection."""
    spec = resolved(tiny_model_dir, name, calibration)
    hessians, _ = rounded_pass(tiny_model_dir, calibration, spec)
    import metrale_model_arch.fp8_quantize as fp8_module
    import metrale_model_arch.int4_gptq as int4_module

    num_runs = 0
    for module in (fp8_module, int4_module):
        gptq_round = module.gptq_round

        def counted(*args: object, run: object = gptq_round, **kwargs: object) -> torch.Tensor:
            nonlocal num_runs
            num_runs += 1
            return run(*args, **kwargs)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(module, "gptq_round", counted)
    out = quantize_checkpoint(source_of(tiny_model_dir), tmp_path / name, spec).out
    assert num_runs == len(hessians) == 2 * 7
    monkeypatch.undo()
    written = load_file(str(out / "model.safetensors"))
    floats = dict(read_float_checkpoint(source_of(tiny_model_dir)).weights)
    for weight_name, hessian in hessians.items():
        prefix = weight_name.removesuffix(".weight")
        if spec.method == QuantizeMethod.FP8:
            q, scale = gptq_fp8(floats[weight_name], hessian, spec.fp8_layout)
            again = {"weight": q.view(torch.uint8), spec.fp8_layout.scale_name: scale}
            written[weight_name] = written[weight_name].view(torch.uint8)
        else:
            assert spec.group_size is not None
            method = Int4Method(str(spec.method))
            levels = gptq_int4(
                floats[weight_name], hessian, spec.group_size, method=method,
                is_symmetric=bool(spec.is_symmetric),
            )  # fmt: skip
            again = pack_int4(levels, method=method)
        for part, tensor in again.items():
            assert torch.equal(written[f"{prefix}.{part}"], tensor), (weight_name, part)


@pytest.mark.parametrize("name", list(SPECS))
def test_the_calibrated_checkpoint_loads_near_the_float_model_and_is_deterministic(
    tiny_model_dir: Path, calibration: Calibration, tmp_path: Path, name: str
) -> None:
    spec = attrs.evolve(SPECS[name], calibration=calibration)
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


def int8_tables(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    """The values a q4 model's int8 embeddings and head hold."""
    embeddings, head = loaded.model.model.embed_tokens, loaded.model.lm_head
    assert isinstance(embeddings, Int8Embedding)
    assert isinstance(head, Int8Linear)
    return {
        "model.embed_tokens": dequantize_rows(embeddings.qweight, embeddings.scale),
        "lm_head": dequantize_rows(head.qweight, head.scale),
    }


def test_the_act_order_checkpoint_serves_as_the_float_model_of_its_levels(
    tiny_model_dir: Path, calibration: Calibration, tmp_path: Path
) -> None:
    """g_idx groups each input's columns in act-order, one order for the projections of one
    input; the loader reads the levels back exactly, and q4 (its inputs gathered by group)
    runs as the float32 model of the levels and its int8 tables."""
    spec = resolved(tiny_model_dir, "gptq-act-g32", calibration)
    _, stored = rounded_pass(tiny_model_dir, calibration, spec)
    out = quantize_checkpoint(source_of(tiny_model_dir), tmp_path / "act", spec).out
    quantization = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quantization["desc_act"] is True
    tensors = load_file(str(out / "model.safetensors"))
    for layer in range(2):
        prefix = f"model.layers.{layer}"
        for parts in (("q", "k", "v"), ("o",), ("gate", "up"), ("down",)):
            block = "mlp" if parts[0] in ("gate", "up", "down") else "self_attn"
            orders = [tensors[f"{prefix}.{block}.{part}_proj.g_idx"] for part in parts]
            cols = orders[0].numel()
            assert torch.equal(torch.bincount(orders[0]), torch.full((cols // 32,), 32))
            assert not torch.equal(orders[0], (torch.arange(cols) // 32).to(torch.int32))
            assert all(torch.equal(order, orders[0]) for order in orders)
    reference = load_model(str(tiny_model_dir))
    set_rounded(reference, dequantized(stored))
    floats = load_model(str(out), LoadOptions(dtype=torch.float32))
    for (name, got), (_, want) in zip(
        floats.model.named_parameters(), reference.model.named_parameters(), strict=True
    ):
        if name.endswith("_proj.weight"):
            assert torch.equal(got, want), name
    q4 = load_model(str(out), LoadOptions(dtype=torch.float32, quantization=Quantization.Q4))
    assert isinstance(q4.model.model.layers[0].mlp.down_proj, OrderedQ4Linear)
    with torch.no_grad():
        for module, values in int8_tables(q4).items():
            floats.model.get_submodule(module).weight.copy_(values)
    prompts = [
        torch.randint(0, floats.config.vocab_size, (n,), generator=seeded(n)).tolist()
        for n in PROMPT_LENGTHS
    ]
    with torch.inference_mode():
        got = torch.cat([q4.model.compute_logits(prefill_hidden(q4, p)) for p in prompts])
        want = torch.cat([floats.model.compute_logits(prefill_hidden(floats, p)) for p in prompts])
    difference = float((got - want).abs().max())
    print(
        f"act-order q4: max |logit diff| {difference:.5f} (largest {float(want.abs().max()):.2f})"
    )
    assert difference < LOGIT_BOUND
