"""KDA ops against naive float64 loops, the chunked form against the recurrent one, and the
chunked form against transformers' own torch path."""

from __future__ import annotations

import inspect

import pytest
import torch

from metrale_kernels import (
    TorchBackend,
    kda_chunked,
    kda_decode_step,
    kda_recurrent,
    short_conv,
)

HEADS = 2
DIM = 16


def naive_short_conv(
    x: torch.Tensor, weight: torch.Tensor, history: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64; ``u`` is the history columns followed by the inputs, one list entry per token."""
    kernel = weight.shape[1]
    u = [history[:, i].double() for i in range(kernel - 1)] + [row.double() for row in x]
    out = []
    for t in range(x.shape[0]):
        total = torch.zeros(x.shape[1], dtype=torch.float64)
        for i in range(kernel):
            total += weight[:, i].double() * u[t + i]
        out.append(total * torch.sigmoid(total))
    return torch.stack(out), torch.stack(u[len(u) - (kernel - 1) :], dim=1)


def naive_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64, one token and one head at a time, written as the recurrence reads."""
    q, k, v, g, beta, state = (t.double() for t in (q, k, v, g, beta, state))
    states = [state[h].clone() for h in range(q.shape[1])]
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = torch.diag(g[t, h].exp()) @ states[h]
            s = s + torch.outer(k[t, h], beta[t, h] * (v[t, h] - s.T @ k[t, h]))
            out[t, h] = s.T @ q[t, h]
            states[h] = s
    return out, torch.stack(states)


def kda_inputs(
    num_tokens: int,
    *,
    seed: int,
    batch: tuple[int, ...] = (),
    decay_scale: float = 5.0,
) -> tuple[torch.Tensor, ...]:
    """``(q, k, v, g, beta, state)`` as the model passes them: q, k unit rows (q times d**-0.5),
    log-decays in ``(-decay_scale, 0)``, a nonzero initial state."""
    generator = torch.Generator().manual_seed(seed)
    shape = (*batch, num_tokens, HEADS, DIM)

    def unit(x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)

    q = unit(torch.randn(shape, generator=generator)) * DIM**-0.5
    k = unit(torch.randn(shape, generator=generator))
    v = torch.randn(shape, generator=generator)
    g = -decay_scale * torch.rand(shape, generator=generator) ** 3
    beta = torch.rand(shape[:-1], generator=generator)
    state = torch.randn((*batch, HEADS, DIM, DIM), generator=generator) * 0.3
    return q, k, v, g, beta, state


@pytest.mark.parametrize("num_tokens", [1, 2, 9])
def test_short_conv_matches_naive(num_tokens: int) -> None:
    generator = torch.Generator().manual_seed(num_tokens)
    channels, kernel = 6, 4
    x = torch.randn(num_tokens, channels, generator=generator).bfloat16()
    weight = torch.randn(channels, kernel, generator=generator)
    history = torch.randn(channels, kernel - 1, generator=generator)
    copies = x.clone(), weight.clone(), history.clone()
    out, new_history = short_conv(x, weight, history)
    expected, expected_history = naive_short_conv(x, weight, history)
    assert out.dtype == new_history.dtype == torch.float32
    assert out.shape == (num_tokens, channels)
    assert new_history.shape == (channels, kernel - 1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_history.double(), expected_history, rtol=0, atol=0)
    for before, after in zip(copies, (x, weight, history), strict=True):
        assert torch.equal(before, after)


@pytest.mark.parametrize("split", [1, 3, 7])
def test_short_conv_split_equals_one_call(split: int) -> None:
    generator = torch.Generator().manual_seed(split)
    channels, kernel = 5, 4
    x = torch.randn(10, channels, generator=generator)
    weight = torch.randn(channels, kernel, generator=generator)
    start = torch.zeros(channels, kernel - 1)
    whole, whole_history = short_conv(x, weight, start)
    first, history = short_conv(x[:split], weight, start)
    second, final_history = short_conv(x[split:], weight, history)
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(final_history, whole_history, rtol=0, atol=0)


def test_kda_recurrent_matches_naive() -> None:
    inputs = kda_inputs(20, seed=0)
    copies = [t.clone() for t in inputs]
    out, state = kda_recurrent(*inputs)
    expected, expected_state = naive_kda(*inputs)
    assert out.dtype == state.dtype == torch.float32
    assert out.shape == (20, HEADS, DIM)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.double(), expected_state, rtol=1e-5, atol=1e-5)
    for before, after in zip(copies, inputs, strict=True):
        assert torch.equal(before, after)


@pytest.mark.parametrize("num_tokens", [1, 63, 64, 65, 150])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_kda_chunked_matches_recurrent(num_tokens: int, chunk_size: int) -> None:
    inputs = kda_inputs(num_tokens, seed=num_tokens + chunk_size)
    copies = [t.clone() for t in inputs]
    out, state = kda_chunked(*inputs, chunk_size=chunk_size)
    expected, expected_state = kda_recurrent(*inputs)
    assert out.dtype == state.dtype == torch.float32
    assert out.shape == (num_tokens, HEADS, DIM)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(state, expected_state, rtol=1e-5, atol=2e-5)
    for before, after in zip(copies, inputs, strict=True):
        assert torch.equal(before, after)


def test_kda_chunked_survives_strong_decay() -> None:
    """Log-decays down to -80 per token (no lower bound): a cumulative decay of thousands over a
    chunk, where ``exp(-G)`` alone overflows float32."""
    inputs = kda_inputs(100, seed=3, decay_scale=80.0)
    out, state = kda_chunked(*inputs)
    expected, expected_state = kda_recurrent(*inputs)
    assert out.isfinite().all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(state, expected_state, rtol=1e-5, atol=2e-5)


def test_kda_chunked_split_carries_state() -> None:
    q, k, v, g, beta, state = kda_inputs(150, seed=4)
    whole, whole_state = kda_chunked(q, k, v, g, beta, state)
    first, mid_state = kda_chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], state)
    second, final_state = TorchBackend().kda_chunked(
        q[70:], k[70:], v[70:], g[70:], beta[70:], mid_state, chunk_size=64
    )
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(final_state, whole_state, rtol=1e-5, atol=2e-5)


def test_kda_chunked_bfloat16_inputs() -> None:
    q, k, v, g, beta, state = kda_inputs(70, seed=5)
    low = [t.bfloat16() for t in (q, k, v, g, beta)]
    out, final = kda_chunked(*low, state)
    expected, expected_state = kda_recurrent(*low, state)
    assert out.dtype == final.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(final, expected_state, rtol=1e-5, atol=2e-5)


def test_kda_decode_step_matches_recurrent_in_place() -> None:
    num_seqs = 3
    q, k, v, g, beta, states = kda_inputs(1, seed=6, batch=(num_seqs,))
    initial = states.clone()
    out = TorchBackend().kda_decode_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], states)
    assert out.shape == (num_seqs, HEADS, DIM)
    assert out.dtype == torch.float32
    for i in range(num_seqs):
        expected, expected_state = kda_recurrent(q[i], k[i], v[i], g[i], beta[i], initial[i])
        torch.testing.assert_close(out[i], expected[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(states[i], expected_state, rtol=1e-6, atol=1e-6)
    assert not torch.equal(states, initial)


def test_kda_decode_step_rejects_low_precision_states() -> None:
    q, k, v, g, beta, states = kda_inputs(1, seed=7, batch=(2,))
    with pytest.raises(ValueError, match="states must be float32"):
        kda_decode_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], states.bfloat16())


def test_kda_chunked_matches_transformers() -> None:
    """transformers' torch chunked KDA (GLM-5.3) normalizes and scales q, k itself (FLA's eps)."""
    modeling = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
    hf_chunked = inspect.unwrap(modeling.chunk_kimi_delta_attention)
    generator = torch.Generator().manual_seed(8)
    shape = (1, 100, HEADS, DIM)
    raw_q, raw_k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    g = -5 * torch.rand(shape, generator=generator)
    beta = torch.rand(shape[:-1], generator=generator)
    state = torch.randn(1, HEADS, DIM, DIM, generator=generator) * 0.3
    hf_out, hf_state = hf_chunked(
        raw_q,
        raw_k,
        v,
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )

    def l2norm(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    out, final = kda_chunked(
        l2norm(raw_q[0]) * DIM**-0.5, l2norm(raw_k[0]), v[0], g[0], beta[0], state[0]
    )
    torch.testing.assert_close(out, hf_out[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(final, hf_state[0], rtol=1e-5, atol=2e-5)


def test_short_conv_matches_transformers() -> None:
    modeling = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
    hf_conv = inspect.unwrap(modeling.causal_conv1d_fn)
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(1, 12, 7, generator=generator)  # (batch, channels, tokens)
    weight = torch.randn(12, 4, generator=generator)
    hf_out = hf_conv(x, weight=weight, bias=None, activation="silu")
    out, _ = short_conv(x[0].T, weight, torch.zeros(12, 3))
    torch.testing.assert_close(out, hf_out[0].T, rtol=1e-6, atol=1e-6)
