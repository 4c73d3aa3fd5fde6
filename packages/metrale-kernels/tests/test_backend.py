"""get_backend and the KernelBackend interface, exercised through the backend it returns."""

from __future__ import annotations

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
    assert backend.name == "torch"
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
    cuda = run_toy_layer(get_backend("cuda"), toy_layer_inputs("cuda"))
    for on_cuda, on_cpu in zip(cuda, cpu, strict=True):
        torch.testing.assert_close(on_cuda.cpu(), on_cpu, atol=1e-5, rtol=1e-5)
