"""The KDA ops as Gated DeltaNet (Qwen3-Next) runs them: one log-decay per head, ``(..., 1)``
broadcast over the key dim, and a value dim unlike the key dim; against a naive float64
recurrence and transformers' torch chunked rule."""

from __future__ import annotations

import inspect

import pytest
import torch

from metrale_kernels import kda_chunked, kda_decode_step, kda_recurrent

HEADS, KEY_DIM, VALUE_DIM = 3, 12, 8


def naive_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64, one token and one head at a time: ``S <- exp(g) S``,
    ``S <- S + k (beta (v - S^T k))^T``, ``o = S^T q``; ``g (T, H)`` one scalar a head."""
    q, k, v, g, beta, state = (t.double() for t in (q, k, v, g, beta, state))
    states = [state[h].clone() for h in range(q.shape[1])]
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = g[t, h].exp() * states[h]
            s = s + torch.outer(k[t, h], beta[t, h] * (v[t, h] - s.T @ k[t, h]))
            out[t, h] = s.T @ q[t, h]
            states[h] = s
    return out, torch.stack(states)


def inputs(num_tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    """``(q, k, v, g (T, H), beta, state)``: unit q/k rows (q scaled), decays in ``(-5, 0)``."""
    generator = torch.Generator().manual_seed(seed)
    key_shape = (num_tokens, HEADS, KEY_DIM)
    q, k = (torch.randn(key_shape, generator=generator) for _ in range(2))
    q = q / q.norm(dim=-1, keepdim=True) * KEY_DIM**-0.5
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn((num_tokens, HEADS, VALUE_DIM), generator=generator)
    g = -5 * torch.rand((num_tokens, HEADS), generator=generator) ** 3
    beta = torch.rand((num_tokens, HEADS), generator=generator)
    state = torch.randn((HEADS, KEY_DIM, VALUE_DIM), generator=generator) * 0.3
    return q, k, v, g, beta, state


@pytest.mark.parametrize(("num_tokens", "chunk_size"), [(1, 64), (23, 5), (70, 64)])
def test_per_head_decay_matches_naive(num_tokens: int, chunk_size: int) -> None:
    q, k, v, g, beta, state = inputs(num_tokens, seed=num_tokens)
    expected, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state)
    gate = g.unsqueeze(-1)
    out, final = kda_chunked(q, k, v, gate, beta, state, chunk_size=chunk_size)
    assert out.shape == (num_tokens, HEADS, VALUE_DIM)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(final.double(), expected_state, rtol=0, atol=1e-5)
    out, final = kda_recurrent(q, k, v, gate, beta, state)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(final.double(), expected_state, rtol=0, atol=1e-5)


def test_per_head_decode_steps_match_naive() -> None:
    q, k, v, g, beta, state = inputs(4, seed=3)
    expected, expected_state = naive_gated_delta_rule(q, k, v, g, beta, state)
    states = state.clone().unsqueeze(0)
    for t in range(4):
        step = slice(t, t + 1)
        out = kda_decode_step(q[step], k[step], v[step], g[step, :, None], beta[step], states)
        torch.testing.assert_close(out[0].double(), expected[t], rtol=0, atol=1e-5)
    torch.testing.assert_close(states[0].double(), expected_state, rtol=0, atol=1e-5)


def test_chunked_matches_transformers_gated_delta_rule() -> None:
    """Qwen3-Next's torch chunked rule (it normalizes and scales q, k itself)."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    hf_chunked = inspect.unwrap(modeling.torch_chunk_gated_delta_rule)
    generator = torch.Generator().manual_seed(8)
    raw_q, raw_k = (torch.randn(1, 100, HEADS, KEY_DIM, generator=generator) for _ in range(2))
    v = torch.randn(1, 100, HEADS, VALUE_DIM, generator=generator)
    g = -5 * torch.rand(1, 100, HEADS, generator=generator)
    beta = torch.rand(1, 100, HEADS, generator=generator)
    state = torch.randn(1, HEADS, KEY_DIM, VALUE_DIM, generator=generator) * 0.3
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
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    q, k = l2norm(raw_q[0]) * KEY_DIM**-0.5, l2norm(raw_k[0])
    out, final = kda_chunked(q, k, v[0], g[0, :, :, None], beta[0], state[0])
    torch.testing.assert_close(out, hf_out[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(final, hf_state[0], rtol=1e-5, atol=2e-5)
