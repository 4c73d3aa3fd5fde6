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
    assert type(backend).paged_attention is KernelBackend.paged_attention
