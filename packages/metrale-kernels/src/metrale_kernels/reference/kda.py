"""Reference Kimi Delta Attention (KDA): the short causal conv and the gated delta recurrence.

One sequence at a time (prefill) or one token for each of a batch of sequences (decode). All
arithmetic is float32, as is the recurrent state ``(heads, d, d_v)``: key dim first, value dim
second (``d_v`` is ``d`` for KDA). The log-decay ``g`` is per channel of the key dim ``(..., d)``
(KDA) or per head, ``(..., 1)`` broadcast over it (Gated DeltaNet, Qwen3-Next). Inputs are
never modified, except the ``states`` that :func:`kda_decode_step` updates in place. "float32"
below is :func:`~metrale_kernels.compute_dtype.compute_dtype`: float64 for float64 inputs.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from metrale_kernels.compute_dtype import compute_dtype

# Rows of a chunk's intra-chunk products are taken this many at a time (see ``_decayed_scores``).
_ROW_BLOCK = 8


def short_conv(
    x: torch.Tensor, weight: torch.Tensor, history: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d + SiLU over ONE sequence, in float32.

    ``x (T, C)`` any float dtype; ``weight (C, K)`` float32; ``history (C, K-1)`` float32: the
    K-1 inputs that precede ``x[0]``, oldest first (zeros at a sequence start). With ``u`` =
    history followed by ``x``: ``out[t, c] = silu(sum_{i<K} weight[c, i] * u[t-K+1+i, c])``.
    Returns ``(out (T, C), new_history (C, K-1))``, both float32; ``new_history`` holds the
    last K-1 inputs of ``u`` (for ``T < K-1`` some of them are old history columns).
    """
    num_tokens = x.shape[0]
    kernel = weight.shape[1]
    # (K-1+T, C): u[K-1+t] is x[t].
    wide = compute_dtype(x.dtype)
    u = torch.cat([history.to(wide).T, x.to(wide)])
    weight = weight.to(wide)
    out = u[:num_tokens] * weight[:, 0]
    for i in range(1, kernel):
        out.addcmul_(u[i : i + num_tokens], weight[:, i])
    new_history = u[u.shape[0] - (kernel - 1) :].T.contiguous()
    return functional.silu(out, inplace=True), new_history


def _delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One token of the recurrence for any leading batch shape ``(*b)``, float32 inputs.

    ``q, k (*b, d)``, ``v (*b, d_v)``, ``g (*b, d)`` or ``(*b, 1)``, ``beta (*b)``, ``state
    (*b, d, d_v)`` updated in place. Returns ``o (*b, d_v)``.
    """
    state.mul_(g.exp().unsqueeze(-1))
    predicted = (k.unsqueeze(-2) @ state).squeeze(-2)
    delta = beta.unsqueeze(-1) * (v - predicted)
    state.addcmul_(k.unsqueeze(-1), delta.unsqueeze(-2))
    return (q.unsqueeze(-2) @ state).squeeze(-2)


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The KDA recurrence over ONE sequence, token by token, in float32.

    ``q, k (T, H, d)`` already L2-normalized (``q`` also scaled by ``d**-0.5``), ``v (T, H, d)``,
    ``g (T, H, d)`` the log-decay (``<= 0``), ``beta (T, H)``, ``state (H, d, d)``. Per token
    and head: ``S <- diag(exp(g_t)) S``; ``S <- S + k_t outer (beta_t * (v_t - S^T k_t))``;
    ``o_t = S^T q_t``. Returns ``(o (T, H, d), final state (H, d, d))``, both float32.
    """
    wide = compute_dtype(v.dtype)
    q, k, v, g, beta = (t.to(wide) for t in (q, k, v, g, beta))
    state = state.to(wide, copy=True)
    out = torch.empty(v.shape, dtype=wide, device=v.device)
    for t in range(q.shape[0]):
        out[t] = _delta_step(q[t], k[t], v[t], g[t], beta[t], state)
    return out, state


def kda_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
) -> torch.Tensor:
    """One token for each of B sequences, the step of :func:`kda_recurrent`.

    ``q, k, v, g (B, H, d)``, ``beta (B, H)``; ``states (B, H, d, d)`` float32 is UPDATED IN
    PLACE (it may be a gathered copy the caller scatters back). Returns ``o (B, H, d)`` float32.
    """
    wide = compute_dtype(v.dtype)
    if states.dtype != wide:
        name = str(wide).removeprefix("torch.")
        raise ValueError(f"states must be {name} (updated in place), got {states.dtype}")
    q, k, v, g, beta = (t.to(wide) for t in (q, k, v, g, beta))
    return _delta_step(q, k, v, g, beta, states)


def _decayed_scores(a: torch.Tensor, b: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = sum_c a_ic b_jc exp(gamma_ic - gamma_jc)`` for ``j <= i``, else 0.

    ``a (*s, H, L, d)``; ``b`` and ``gamma (H, L, d)``, broadcast against it; ``gamma`` (cumulative
    log-decay) is non-increasing along ``L``. ``exp(gamma_i)`` and ``exp(-gamma_j)`` alone can
    under- and overflow, so rows go in blocks starting at ``r``: for ``j < r <= i`` the factor is
    ``exp(gamma_i - gamma_r) * exp(gamma_r - gamma_j)``, both ``<= 1``; inside a block it is
    formed pair by pair.
    """
    length = a.shape[-2]
    out = a.new_zeros((*a.shape[:-1], length))
    causal = torch.ones(_ROW_BLOCK, _ROW_BLOCK, dtype=torch.bool, device=a.device).tril()
    for start in range(0, length, _ROW_BLOCK):
        stop = min(start + _ROW_BLOCK, length)
        rows, row_gamma = a[..., start:stop, :], gamma[..., start:stop, :]
        if start:
            anchor = gamma[..., start : start + 1, :]
            before = b[..., :start, :] * (anchor - gamma[..., :start, :]).exp()
            out[..., start:stop, :start] = (rows * (row_gamma - anchor).exp()) @ before.mT
        size = stop - start
        # (H, rows, cols, d): exp(gamma_i - gamma_j), zero above the diagonal.
        diff = row_gamma.unsqueeze(-2) - row_gamma.unsqueeze(-3)
        decay = diff.masked_fill(~causal[:size, :size, None], float("-inf")).exp()
        cols = b[..., start:stop, :].unsqueeze(-3)
        out[..., start:stop, start:stop] = (rows.unsqueeze(-2) * cols * decay).sum(-1)
    return out


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kda_recurrent`'s contract and result (to float32 rounding), in chunks of tokens.

    Per chunk and head, with ``G`` the cumulative log-decay from the chunk start, ``S`` the
    state entering it and ``b`` = beta: ``A[i, j] = b_i sum_c k_ic k_jc exp(G_ic - G_jc)`` for
    ``j < i``; ``(I + A) [U | W] = [b V | b K exp(G)]`` by forward substitution (the UT transform);
    ``V' = U - W S``; ``O = (Q exp(G)) S + tril(sum_c q_ic k_jc exp(G_ic - G_jc)) V'``;
    ``S <- exp(G_last) S + (K exp(G_last - G))^T V'``. ``T`` need not be a multiple of
    ``chunk_size``: the last chunk is shorter.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    num_tokens, num_heads, dim = v.shape
    # (H, T, d) and (H, T, 1)
    wide = compute_dtype(v.dtype)
    q, k, v, g = (t.to(wide).transpose(0, 1) for t in (q, k, v, g))
    beta = beta.to(wide).T.unsqueeze(-1)
    state = state.to(wide, copy=True)
    out = torch.empty(num_tokens, num_heads, dim, dtype=wide, device=v.device)
    for start in range(0, num_tokens, chunk_size):
        span = slice(start, min(start + chunk_size, num_tokens))
        q_c, k_c, v_c, beta_c = q[:, span], k[:, span], v[:, span], beta[:, span]
        gamma = g[:, span].cumsum(1)
        # (2, H, L, L): the key-key and query-key products, one pass over the decays.
        key_key, query_key = _decayed_scores(torch.stack([k_c, q_c]), k_c, gamma).unbind(0)
        system = beta_c * key_key.tril(-1)
        system.diagonal(dim1=-2, dim2=-1).fill_(1.0)
        rhs = torch.cat([beta_c * v_c, beta_c * k_c * gamma.exp()], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u, w = solved.split([dim, k_c.shape[-1]], dim=-1)
        new_values = u - w @ state
        attended = (q_c * gamma.exp()) @ state + query_key @ new_values
        out[span] = attended.transpose(0, 1)
        last = gamma[:, -1:]
        state = state * last.mT.exp() + (k_c * (last - gamma).exp()).mT @ new_values
    return out, state
