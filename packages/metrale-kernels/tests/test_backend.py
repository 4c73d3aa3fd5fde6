"""get_backend and KernelBackend: every op through the backend, a partial backend's fallbacks."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from metrale_kernels import (
    KernelBackend,
    TorchBackend,
    build_attention_metadata,
    cos_sin_cache,
    default_inv_freq,
    get_backend,
)
from metrale_kernels.op import Op, kernel
from metrale_kernels.reference.pointwise import rms_norm


def toy_layer_inputs(device: torch.device | str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = {"hidden": (5, 32), "q": (5, 4, 8), "k": (5, 2, 8), "v": (5, 2, 8)}
    return {
        name: torch.randn(shape, generator=generator).to(device) for name, shape in shapes.items()
    }


def run_toy_layer(
    backend: KernelBackend, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every op once, as a layer runs them for a 5-token prompt: (attention out, MLP act)."""
    device = inputs["q"].device
    k_cache = torch.zeros(3, 4, 2, 8, device=device)
    v_cache = torch.zeros(3, 4, 2, 8, device=device)
    metadata = build_attention_metadata(
        block_tables=[[2, 0]], seq_lens=[5], query_lens=[5], block_size=4, device=device
    )
    table = cos_sin_cache(default_inv_freq(8, 10000.0), 16).to(device)
    normed = backend.rms_norm(inputs["hidden"], torch.ones(32, device=device), 1e-6)
    positions = torch.arange(5, device=device)
    q, k = backend.apply_rotary(inputs["q"], inputs["k"], positions, table)
    backend.write_kv(k, inputs["v"], k_cache, v_cache, metadata.slot_mapping)
    attended = backend.paged_attention(q, k_cache, v_cache, metadata, 8**-0.5)
    return attended, backend.silu_and_mul(normed)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_get_backend_cpu_runs_every_op(device: torch.device | str) -> None:
    backend = get_backend(device)
    assert isinstance(backend, TorchBackend)
    # auto on the CPU: the native kernels where a C++ compiler can build them.
    assert backend.name == ("cpu" if shutil.which(os.environ.get("CXX", "c++")) else "torch")
    inputs = toy_layer_inputs(device)
    attended, activated = run_toy_layer(backend, inputs)
    assert attended.shape == (5, 4, 8)
    assert activated.shape == (5, 16)
    assert torch.isfinite(attended).all()
    # The first token attends only to itself: each query head returns its kv head's value.
    expected_first = inputs["v"][0].repeat_interleave(2, dim=0)
    torch.testing.assert_close(attended[0], expected_first)


@pytest.mark.gpu
def test_torch_backend_on_cuda_matches_cpu() -> None:
    cpu = run_toy_layer(get_backend("cpu"), toy_layer_inputs("cpu"))
    cuda = run_toy_layer(get_backend("cuda", "torch"), toy_layer_inputs("cuda"))
    for on_cuda, on_cpu in zip(cuda, cpu, strict=True):
        torch.testing.assert_close(on_cuda.cpu(), on_cpu, atol=1e-5, rtol=1e-5)


class DoubledNormBackend(KernelBackend):
    """Overrides only ``rms_norm``, the way a CUDA backend overrides the ops it has."""

    name = "doubled-norm"

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return 2 * super().rms_norm(x, weight, eps, out=out)


def test_partial_backend_falls_back_to_the_reference() -> None:
    inputs = toy_layer_inputs("cpu")
    attended, activated = run_toy_layer(DoubledNormBackend(), inputs)
    reference_attended, reference_activated = run_toy_layer(TorchBackend(), inputs)
    torch.testing.assert_close(attended, reference_attended, rtol=0, atol=0)
    # silu_and_mul ran on the doubled norm: only the overridden op changed.
    expected = TorchBackend().silu_and_mul(
        2 * TorchBackend().rms_norm(inputs["hidden"], torch.ones(32), 1e-6)
    )
    torch.testing.assert_close(activated, expected, rtol=0, atol=0)
    assert not torch.equal(activated, reference_activated)


def test_get_backend_returns_a_kernel_backend() -> None:
    backend = get_backend("cpu", "torch")
    assert isinstance(backend, KernelBackend)
    assert backend.paged_attention is KernelBackend.paged_attention.reference
    assert TorchBackend.reference_ops() == sorted(op.name for op in KernelBackend.ops())


@kernel(KernelBackend.rms_norm)
def doubled_rms_norm(
    backend: KernelBackend,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    return 2 * backend.fallback(KernelBackend.rms_norm, "doubles it")(x, weight, eps, out=out)


class DoubledNormKernel(TorchBackend, kernels=[doubled_rms_norm]):
    """Registers a kernel for ``rms_norm`` only, the way the device backends do."""


def test_a_registered_kernel_serves_its_op_and_the_rest_are_references() -> None:
    inputs = toy_layer_inputs("cpu")
    attended, activated = run_toy_layer(DoubledNormKernel(), inputs)
    reference_attended, _ = run_toy_layer(TorchBackend(), inputs)
    torch.testing.assert_close(attended, reference_attended, rtol=0, atol=0)
    expected = TorchBackend().silu_and_mul(2 * rms_norm(inputs["hidden"], torch.ones(32), 1e-6))
    torch.testing.assert_close(activated, expected, rtol=0, atol=0)
    assert "rms_norm" not in DoubledNormKernel.reference_ops()
    assert "silu_and_mul" in DoubledNormKernel.reference_ops()


def test_a_kernel_must_be_for_a_declared_op_and_one_per_op() -> None:
    with pytest.raises(TypeError, match="two kernels for rms_norm"):
        type("Twice", (TorchBackend,), {}, kernels=[doubled_rms_norm, doubled_rms_norm])
    stray = kernel(Op(rms_norm, name="stray_norm"))(doubled_rms_norm.function)
    with pytest.raises(TypeError, match="an op it does not have"):
        type("Stray", (TorchBackend,), {}, kernels=[stray])


def test_an_op_is_dispatched_once_per_class_not_per_call() -> None:
    # A reference is a static method and a kernel a plain function on the class: a call is
    # one ordinary call, with no lookup of which function serves the op.
    assert vars(TorchBackend)["rms_norm"].__func__ is rms_norm
    assert vars(DoubledNormKernel)["rms_norm"] is doubled_rms_norm.function


def scale_rows(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A test-only op: ``x * factor``."""
    return x * factor


@pytest.fixture
def scale_rows_op(monkeypatch: pytest.MonkeyPatch) -> Op[[torch.Tensor, float], torch.Tensor]:
    """The one place a new op is declared: its reference, as an :class:`Op` on the interface."""
    op = Op(scale_rows)
    monkeypatch.setattr(KernelBackend, "scale_rows", op, raising=False)
    return op


def every_backend() -> list[KernelBackend]:
    from metrale_kernels.cpu.backend import CpuBackend
    from metrale_kernels.cuda.backend import CupyBackend

    cupy = CupyBackend.__new__(CupyBackend)  # its kernels' dispatch, without a GPU
    cupy._fallbacks_logged = set()
    return [TorchBackend(), CpuBackend(), cupy, DoubledNormKernel()]


def test_a_new_op_declared_in_one_place_reaches_every_backends_fallback(
    scale_rows_op: Op[[torch.Tensor, float], torch.Tensor],
) -> None:
    x = torch.randn(3, 4)
    for backend in every_backend():
        assert scale_rows_op in type(backend).ops()
        assert "scale_rows" in type(backend).reference_ops()
        result = backend.scale_rows(x, 3.0)  # type: ignore[attr-defined]
        torch.testing.assert_close(result, 3 * x, rtol=0, atol=0)

    @kernel(scale_rows_op)
    def scale_rows_kernel(backend: KernelBackend, x: torch.Tensor, factor: float) -> torch.Tensor:
        return x.mul(factor).add_(1)

    # A backend class made after the declaration resolves it like a built-in op.
    with_kernel = type("WithKernel", (TorchBackend,), {}, kernels=[scale_rows_kernel])()
    torch.testing.assert_close(with_kernel.scale_rows(x, 3.0), 3 * x + 1, rtol=0, atol=0)  # type: ignore[attr-defined]
    assert "scale_rows" not in type(with_kernel).reference_ops()


def test_nothing_in_src_imports_the_testing_harnesses() -> None:
    import ast
    from pathlib import Path

    import metrale_kernels

    root = Path(metrale_kernels.__file__).parent
    importers = []
    for path in root.rglob("*.py"):
        if "testing" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(name.startswith("metrale_kernels.testing") for name in names):
                importers.append(str(path.relative_to(root)))
    assert not importers
