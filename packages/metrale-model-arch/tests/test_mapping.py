"""The checkpoint mapping hook, through ``build_model``: renames, stacking, fusing, skips, and
the errors naming what did not fit."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest
import torch
from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import KernelBackend
from metrale_model_arch import LoadOptions
from metrale_model_arch.build import CheckpointError, build_model
from metrale_model_arch.families.base import CausalLM
from metrale_model_arch.families.checkpoint_mapping import CheckpointMapping, Skip, TensorTarget
from metrale_model_arch.registry import ARCHITECTURES, LLAMA

NUM_EXPERTS, HIDDEN, INTER = 3, 4, 2


class ToyLM(CausalLM):
    """Stacked experts ``(experts, 2 * inter, hidden)``, a router, a plain norm."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_seq_len: int | None = None,
        backend: KernelBackend | None = None,
    ) -> None:
        super().__init__()
        del backend
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.gate_up = nn.Parameter(torch.empty(NUM_EXPERTS, 2 * INTER, HIDDEN))
        self.router = nn.Linear(HIDDEN, NUM_EXPERTS, bias=False)
        self.norm = nn.Parameter(torch.empty(HIDDEN))


def toy_mapping(config: ModelConfig) -> CheckpointMapping:
    del config

    def target(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        del shape
        parts = name.split(".")
        if parts[0] == "experts":  # experts.E.{gate,up}
            half = slice(0, INTER) if parts[2] == "gate" else slice(INTER, None)
            return TensorTarget("gate_up", (int(parts[1]), half))
        if name == "mlp.gate.weight":
            return TensorTarget("router.weight", keep_float32=True)
        if name == "final_norm":
            return TensorTarget("norm")
        if name.startswith("visual."):
            return Skip("vision tower")
        return None

    return target


@pytest.fixture
def toy_config(tiny_config: ModelConfig, monkeypatch: pytest.MonkeyPatch) -> ModelConfig:
    record = attrs.evolve(LLAMA, model_type="toy", module=ToyLM, checkpoint_mapping=toy_mapping)
    monkeypatch.setitem(ARCHITECTURES, "toy", record)
    return attrs.evolve(tiny_config, model_type="toy")


def checkpoint() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    tensors = {
        f"experts.{e}.{proj}": torch.randn(INTER, HIDDEN)
        for e in range(NUM_EXPERTS)
        for proj in ("gate", "up")
    }
    tensors["mlp.gate.weight"] = torch.randn(NUM_EXPERTS, HIDDEN)
    tensors["final_norm"] = torch.randn(HIDDEN)
    tensors["visual.patch_embed.weight"] = torch.randn(7)
    return tensors


def build(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> CausalLM:
    items: Iterator[tuple[str, torch.Tensor]] = iter(tensors.items())
    return build_model(config, items, LoadOptions(dtype=torch.bfloat16, device="cpu"))


def test_renames_stacks_fuses_and_skips(toy_config: ModelConfig) -> None:
    tensors = checkpoint()
    model = build(toy_config, tensors)
    params = dict(model.named_parameters())
    for e in range(NUM_EXPERTS):
        assert torch.equal(params["gate_up"][e, :INTER], tensors[f"experts.{e}.gate"].bfloat16())
        assert torch.equal(params["gate_up"][e, INTER:], tensors[f"experts.{e}.up"].bfloat16())
    assert params["gate_up"].dtype == torch.bfloat16
    assert torch.equal(params["norm"], tensors["final_norm"].bfloat16())


def test_keep_float32_stays_float32_under_bf16(toy_config: ModelConfig) -> None:
    tensors = checkpoint()
    router = build(toy_config, tensors).get_submodule("router").weight
    assert router.dtype == torch.float32
    assert torch.equal(router, tensors["mlp.gate.weight"])


def test_unmapped_tensor_is_named(toy_config: ModelConfig) -> None:
    tensors = {**checkpoint(), "mtp.0.weight": torch.zeros(2)}
    with pytest.raises(CheckpointError, match=r"1 unexpected tensor\(s\): mtp\.0\.weight"):
        build(toy_config, tensors)


def test_parameter_never_written_is_named(toy_config: ModelConfig) -> None:
    tensors = checkpoint()
    del tensors["final_norm"]
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): norm$"):
        build(toy_config, tensors)


def test_part_of_a_stacked_parameter_never_written_is_named(toy_config: ModelConfig) -> None:
    tensors = checkpoint()
    del tensors["experts.1.up"]
    with pytest.raises(
        CheckpointError, match=r"gate_up \(parts never written: \(1, 2\), \(1, 3\)\)"
    ):
        build(toy_config, tensors)


def test_a_part_written_twice_is_refused(
    toy_config: ModelConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = toy_mapping(toy_config)

    def twice(name: str, shape: tuple[int, ...]) -> TensorTarget | Skip | None:
        if name == "experts.0.up":
            return TensorTarget("gate_up", (0, slice(0, INTER)))
        return base(name, shape)

    monkeypatch.setitem(
        ARCHITECTURES, "toy", attrs.evolve(ARCHITECTURES["toy"], checkpoint_mapping=lambda c: twice)
    )
    with pytest.raises(CheckpointError, match=r"'experts\.0\.up' writes gate_up\[0, :2\]"):
        build(toy_config, checkpoint())


def test_shape_mismatch_names_both_shapes(toy_config: ModelConfig) -> None:
    tensors = {**checkpoint(), "experts.2.gate": torch.zeros(INTER + 1, HIDDEN)}
    with pytest.raises(
        CheckpointError,
        match=r"'experts\.2\.gate' has shape \(3, 4\), gate_up\[2, :2\] is \(2, 4\)",
    ):
        build(toy_config, tensors)
