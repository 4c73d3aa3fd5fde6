"""fused_moe against a per-token, per-expert loop, a float64 reference and transformers."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss
from transformers.models.mixtral import modeling_mixtral as mixtral

from metrale_kernels import TorchBackend, fused_moe, softmax_topk_routing

HIDDEN = 24
INTER = 40


def make_experts(
    num_experts: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_gate_up (experts, 2 * inter, hidden), w_down (experts, hidden, inter))``."""
    generator = torch.Generator().manual_seed(seed)
    w_gate_up = torch.randn(num_experts, 2 * INTER, HIDDEN, generator=generator) / HIDDEN**0.5
    w_down = torch.randn(num_experts, HIDDEN, INTER, generator=generator) / INTER**0.5
    return w_gate_up.to(dtype), w_down.to(dtype)


def naive_moe(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    swiglu_limit: float | None = None,
) -> torch.Tensor:
    """One token and one of its experts at a time, in the dtype of the inputs."""
    out = torch.zeros_like(hidden)
    for token in range(hidden.shape[0]):
        for k in range(topk_ids.shape[1]):
            expert = int(topk_ids[token, k])
            gate, up = (w_gate_up[expert] @ hidden[token]).chunk(2)
            if swiglu_limit is not None:
                gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
            expert_out = w_down[expert] @ (torch.nn.functional.silu(gate) * up)
            out[token] += topk_weights[token, k].to(hidden.dtype) * expert_out
    return out


def routed_inputs(
    num_tokens: int, num_experts: int, top_k: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden, topk_weights, topk_ids)``; the last expert never gets a token."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, HIDDEN, generator=generator).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=generator)
    logits[:, -1] = -1e9
    weights, ids = softmax_topk_routing(logits, top_k, renormalize=top_k > 1)
    return hidden, weights, ids


CASES = [(1, 8, 2), (1, 8, 1), (9, 8, 1), (33, 8, 2), (16, 5, 4), (64, 16, 6)]


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k"), CASES)
def test_matches_the_naive_loop_and_float64(num_tokens: int, num_experts: int, top_k: int) -> None:
    hidden, weights, ids = routed_inputs(num_tokens, num_experts, top_k, seed=num_tokens)
    w_gate_up, w_down = make_experts(num_experts, seed=top_k)
    out = fused_moe(hidden, w_gate_up, w_down, weights, ids)
    assert out.shape == hidden.shape
    assert out.dtype == torch.float32
    torch.testing.assert_close(
        out, naive_moe(hidden, w_gate_up, w_down, weights, ids), rtol=1e-5, atol=1e-5
    )
    reference = naive_moe(
        hidden.double(), w_gate_up.double(), w_down.double(), weights.double(), ids
    )
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)


def test_tied_routing() -> None:
    """Exact ties in the router logits: the experts torch.topk picked, each counted once."""
    logits = torch.tensor([[1.0] * 4 + [0.0] * 4, [2.0, 0.0] * 4, [0.0] * 8, [3.0] * 8])
    weights, ids = softmax_topk_routing(logits, 3, renormalize=True)
    hidden = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(1))
    w_gate_up, w_down = make_experts(8, seed=2)
    out = fused_moe(hidden, w_gate_up, w_down, weights, ids)
    expected = naive_moe(
        hidden.double(), w_gate_up.double(), w_down.double(), weights.double(), ids
    )
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("num_tokens", "top_k"), [(1, 2), (40, 2), (7, 1)])
def test_bfloat16(num_tokens: int, top_k: int) -> None:
    hidden, weights, ids = routed_inputs(num_tokens, 8, top_k, seed=3, dtype=torch.bfloat16)
    w_gate_up, w_down = make_experts(8, seed=4, dtype=torch.bfloat16)
    out = fused_moe(hidden, w_gate_up, w_down, weights, ids)
    assert out.dtype == torch.bfloat16
    reference = naive_moe(
        hidden.double(), w_gate_up.double(), w_down.double(), weights.double(), ids
    )
    torch.testing.assert_close(out.double(), reference, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("top_k", [1, 2])
def test_matches_transformers_mixtral_experts(top_k: int) -> None:
    """The stacked layout (gate rows first, then up) is transformers' ``gate_up_proj``."""
    config = transformers.MixtralConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_local_experts=8, num_experts_per_tok=top_k
    )
    experts = mixtral.MixtralExperts(config)
    w_gate_up, w_down = make_experts(8, seed=6)
    with torch.no_grad():
        experts.gate_up_proj.copy_(w_gate_up)
        experts.down_proj.copy_(w_down)
    hidden, weights, ids = routed_inputs(21, 8, top_k, seed=7)
    with torch.no_grad():
        expected = experts(hidden, ids, weights)
    out = TorchBackend().fused_moe(hidden, w_gate_up, w_down, weights, ids)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_swiglu_limit_clamps_gate_and_up() -> None:
    hidden, weights, ids = routed_inputs(12, 8, 2, seed=8)
    hidden = hidden * 10
    w_gate_up, w_down = make_experts(8, seed=9)
    clamped = fused_moe(hidden, w_gate_up, w_down, weights, ids, swiglu_limit=1.5)
    expected = naive_moe(hidden, w_gate_up, w_down, weights, ids, swiglu_limit=1.5)
    torch.testing.assert_close(clamped, expected, rtol=1e-5, atol=1e-5)
    unclamped = fused_moe(hidden, w_gate_up, w_down, weights, ids)
    assert not torch.allclose(clamped, unclamped)
    loose = fused_moe(hidden, w_gate_up, w_down, weights, ids, swiglu_limit=1e9)
    torch.testing.assert_close(loose, unclamped)


def test_out_receives_the_result() -> None:
    hidden, weights, ids = routed_inputs(5, 8, 2, seed=10)
    w_gate_up, w_down = make_experts(8, seed=11)
    out = torch.full_like(hidden, float("nan"))
    assert fused_moe(hidden, w_gate_up, w_down, weights, ids, out=out) is out
    torch.testing.assert_close(out, fused_moe(hidden, w_gate_up, w_down, weights, ids))


def test_no_tokens() -> None:
    w_gate_up, w_down = make_experts(4, seed=12)
    out = fused_moe(
        torch.empty(0, HIDDEN),
        w_gate_up,
        w_down,
        torch.empty(0, 2),
        torch.empty(0, 2, dtype=torch.int64),
    )
    assert out.shape == (0, HIDDEN)


def gpt_oss_experts(num_experts: int, seed: int, alpha: float, limit: float) -> nn.Module:
    """transformers' ``GptOssExperts`` with random weights and biases."""
    config = transformers.GptOssConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_local_experts=num_experts,
        swiglu_alpha=alpha,
        swiglu_limit=limit,
    )
    experts = gpt_oss.GptOssExperts(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in experts.parameters():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) / 4)
    return experts


def swigluoai_moe(
    experts: nn.Module, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """``fused_moe`` over transformers' gpt-oss layout, read through transposed views."""
    return fused_moe(
        hidden,
        experts.gate_up_proj.transpose(1, 2),
        experts.down_proj.transpose(1, 2),
        weights,
        ids,
        activation="swigluoai",
        swiglu_alpha=experts.alpha,
        swiglu_limit=experts.limit,
        gate_up_bias=experts.gate_up_proj_bias,
        down_bias=experts.down_proj_bias,
    )


@pytest.mark.parametrize(("num_tokens", "top_k"), [(1, 2), (21, 2), (40, 4)])
def test_swigluoai_matches_transformers_gpt_oss_experts(num_tokens: int, top_k: int) -> None:
    """Interleaved gate/up columns, biases after both projections, the clamp reached."""
    experts = gpt_oss_experts(8, seed=num_tokens, alpha=1.702, limit=1.5)
    hidden, weights, ids = routed_inputs(num_tokens, 8, top_k, seed=15)
    hidden = hidden * 4
    with torch.no_grad():
        expected = experts(hidden, ids, weights)
        out = swigluoai_moe(experts, hidden, weights, ids)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        # Each part matters: without the clamp, the biases or the interleaving it is far off.
        experts.limit = 1e9
        assert (swigluoai_moe(experts, hidden, weights, ids) - expected).abs().max() > 1e-2
        experts.limit = 1.5
        experts.down_proj_bias.zero_()
        assert (swigluoai_moe(experts, hidden, weights, ids) - expected).abs().max() > 1e-2


def test_swigluoai_gives_a_token_the_same_bits_alone_and_among_others() -> None:
    experts = gpt_oss_experts(8, seed=16, alpha=1.702, limit=7.0)
    hidden, weights, ids = routed_inputs(37, 8, 2, seed=17)
    with torch.no_grad():
        together = swigluoai_moe(experts, hidden, weights, ids)
        for token in (0, 5, 36):
            rows = slice(token, token + 1)
            alone = swigluoai_moe(experts, hidden[rows], weights[rows], ids[rows])
            assert torch.equal(alone, together[rows])


def test_swigluoai_needs_alpha_and_limit() -> None:
    hidden, weights, ids = routed_inputs(2, 4, 1, seed=18)
    w_gate_up, w_down = make_experts(4, seed=19)
    with pytest.raises(ValueError, match="'swigluoai' needs swiglu_alpha and swiglu_limit"):
        fused_moe(hidden, w_gate_up, w_down, weights, ids, activation="swigluoai", swiglu_limit=7.0)


def test_unknown_activation() -> None:
    hidden, weights, ids = routed_inputs(2, 4, 1, seed=13)
    w_gate_up, w_down = make_experts(4, seed=14)
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_moe(hidden, w_gate_up, w_down, weights, ids, activation="gelu")
