"""The MoE routers against transformers' own: Mixtral, Qwen3-MoE and DeepSeek-V3."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as deepseek_v2
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek_v3
from transformers.models.mixtral import modeling_mixtral as mixtral
from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3_moe

from metrale_kernels import TorchBackend, grouped_sigmoid_topk_routing, softmax_topk_routing

NUM_EXPERTS = 8
# Rows with exact ties: softmax makes tied logits tied probabilities, which go to the lower expert
# id (transformers' torch.topk picks among them in no set order: the same weights, maybe other
# ids).
TIED_LOGITS = torch.tensor(
    [
        [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        [2.0, 0.0, 2.0, 0.0, 2.0, 0.0, 2.0, 0.0],
        [0.0] * NUM_EXPERTS,
        [0.5, 3.0, 0.5, 0.5, 3.0, 0.5, 0.5, 0.5],
        [-1.0, -1.0, 4.0, -1.0, -1.0, -1.0, -1.0, 4.0],
    ]
)


def identity_router(router: torch.nn.Module, dtype: torch.dtype = torch.float32) -> None:
    """Router weights = identity, so the hidden states passed in are the router logits."""
    with torch.no_grad():
        router.weight.copy_(torch.eye(NUM_EXPERTS))
    router.to(dtype)


def mixtral_router(top_k: int) -> torch.nn.Module:
    config = transformers.MixtralConfig(
        hidden_size=NUM_EXPERTS, num_local_experts=NUM_EXPERTS, num_experts_per_tok=top_k
    )
    router = mixtral.MixtralTopKRouter(config)
    identity_router(router)
    return router


def lower_id_first(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """The ids the tie rule picks, row by row in plain Python: by score, then by id."""
    return torch.tensor(
        [sorted(range(len(row)), key=lambda e: (-row[e], e))[:top_k] for row in scores.tolist()]
    )


def assert_ids_match(
    ids: torch.Tensor, hf_ids: torch.Tensor, logits: torch.Tensor, *, tied: bool
) -> None:
    """transformers' ids where no two chosen scores tie; the lower id first where they do."""
    if not tied:
        assert torch.equal(ids, hf_ids)
        return
    assert torch.equal(ids, lower_id_first(logits, ids.shape[1]))
    assert not torch.equal(ids, hf_ids), "no tie decided otherwise than torch.topk: a weak case"


def random_logits(num_tokens: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(num_tokens, NUM_EXPERTS, generator=generator) * 2).to(dtype)


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("logits", ["random", "tied"])
def test_softmax_topk_matches_mixtral_router(top_k: int, logits: str) -> None:
    router_logits = random_logits(37, seed=top_k) if logits == "random" else TIED_LOGITS
    with torch.no_grad():
        _, hf_weights, hf_ids = mixtral_router(top_k)(router_logits)
    weights, ids = softmax_topk_routing(router_logits, top_k, renormalize=True)
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int64)
    assert weights.shape == ids.shape == (router_logits.shape[0], top_k)
    assert_ids_match(ids, hf_ids, router_logits, tied=logits == "tied")
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("top_k", [1, 4])
@pytest.mark.parametrize("logits", ["random", "tied"])
def test_softmax_topk_matches_qwen3_moe_router(
    norm_topk_prob: bool, top_k: int, logits: str
) -> None:
    config = transformers.Qwen3MoeConfig(
        hidden_size=NUM_EXPERTS,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=top_k,
        norm_topk_prob=norm_topk_prob,
    )
    router = qwen3_moe.Qwen3MoeTopKRouter(config)
    identity_router(router)
    router_logits = random_logits(29, seed=top_k) if logits == "random" else TIED_LOGITS
    with torch.no_grad():
        _, hf_weights, hf_ids = router(router_logits)
    weights, ids = TorchBackend().softmax_topk_routing(router_logits, top_k, norm_topk_prob)
    assert_ids_match(ids, hf_ids, router_logits, tied=logits == "tied")
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)


def test_softmax_topk_bfloat16_logits() -> None:
    """transformers returns the weights in the logits' dtype; ours stay float32."""
    config = transformers.Qwen3MoeConfig(
        hidden_size=NUM_EXPERTS, num_experts=NUM_EXPERTS, num_experts_per_tok=2
    )
    router = qwen3_moe.Qwen3MoeTopKRouter(config)
    identity_router(router, torch.bfloat16)
    router_logits = random_logits(64, seed=5, dtype=torch.bfloat16)
    with torch.no_grad():
        _, hf_weights, hf_ids = router(router_logits)
    weights, ids = softmax_topk_routing(router_logits, 2, renormalize=False)
    assert weights.dtype == torch.float32
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights.float(), rtol=1e-2, atol=1e-2)


def deepseek_router(
    *, num_experts: int, top_k: int, num_groups: int, topk_groups: int, renormalize: bool
) -> torch.nn.Module:
    config = transformers.DeepseekV3Config(
        hidden_size=32,
        n_routed_experts=num_experts,
        num_experts_per_tok=top_k,
        n_group=num_groups,
        topk_group=topk_groups,
        norm_topk_prob=renormalize,
        routed_scaling_factor=2.5,
    )
    return deepseek_v3.DeepseekV3TopkRouter(config)


@pytest.mark.parametrize(
    ("num_experts", "top_k", "num_groups", "topk_groups"),
    [(16, 4, 4, 2), (16, 1, 4, 1), (32, 8, 8, 4), (8, 2, 1, 1), (12, 3, 3, 3)],
)
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("bias_scale", [0.1, 1.0])
def test_grouped_sigmoid_topk_matches_deepseek_v3_router(
    num_experts: int,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    bias_scale: float,
) -> None:
    generator = torch.Generator().manual_seed(num_experts + top_k)
    router = deepseek_router(
        num_experts=num_experts,
        top_k=top_k,
        num_groups=num_groups,
        topk_groups=topk_groups,
        renormalize=renormalize,
    )
    with torch.no_grad():
        router.weight.copy_(torch.randn(num_experts, 32, generator=generator))
        router.e_score_correction_bias.copy_(
            torch.randn(num_experts, generator=generator) * bias_scale
        )
    hidden = torch.randn(41, 32, generator=generator)
    with torch.no_grad():
        router_logits, hf_weights, hf_ids = router(hidden)
    weights, ids = grouped_sigmoid_topk_routing(
        router_logits,
        router.e_score_correction_bias,
        top_k,
        num_groups=num_groups,
        topk_groups=topk_groups,
        renormalize=renormalize,
        routed_scaling_factor=2.5,
    )
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int64)
    # transformers picks with sorted=False: compare each row's experts in id order.
    ids_sorted, order = ids.sort(dim=-1)
    hf_ids_sorted, hf_order = hf_ids.sort(dim=-1)
    assert torch.equal(ids_sorted, hf_ids_sorted)
    torch.testing.assert_close(
        weights.gather(1, order), hf_weights.gather(1, hf_order), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize(
    ("num_experts", "top_k", "num_groups", "topk_groups"),
    [(16, 4, 4, 2), (16, 1, 4, 1), (32, 6, 8, 3), (8, 2, 1, 1), (12, 3, 3, 3)],
)
def test_grouped_softmax_topk_matches_deepseek_v2_router(
    num_experts: int, top_k: int, num_groups: int, topk_groups: int
) -> None:
    generator = torch.Generator().manual_seed(num_experts + top_k)
    config = transformers.DeepseekV2Config(
        hidden_size=32,
        n_routed_experts=num_experts,
        num_experts_per_tok=top_k,
        n_group=num_groups,
        topk_group=topk_groups,
        topk_method="greedy" if num_groups == 1 else "group_limited_greedy",
        routed_scaling_factor=1.5,
    )
    router = deepseek_v2.DeepseekV2TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.randn(num_experts, 32, generator=generator))
        router_logits, hf_weights, hf_ids = router(torch.randn(41, 32, generator=generator))
    weights, ids = TorchBackend().grouped_softmax_topk_routing(
        router_logits,
        top_k,
        num_groups=num_groups,
        topk_groups=topk_groups,
        routed_scaling_factor=1.5,
    )
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int64)
    ids_sorted, order = ids.sort(dim=-1)
    hf_ids_sorted, hf_order = hf_ids.sort(dim=-1)
    assert torch.equal(ids_sorted, hf_ids_sorted)
    torch.testing.assert_close(
        weights.gather(1, order), hf_weights.gather(1, hf_order), rtol=1e-6, atol=1e-6
    )


def test_grouped_softmax_routing_never_leaves_the_chosen_groups() -> None:
    # Group 1 (experts 4-7) holds the best expert; group 0 the second and third best.
    router_logits = torch.tensor([[3.0, 2.9, -9.0, -9.0, 9.0, -9.0, -9.0, -9.0]])
    weights, ids = TorchBackend().grouped_softmax_topk_routing(
        router_logits, 2, num_groups=2, topk_groups=1
    )
    assert ids.tolist() == [[4, 5]]
    torch.testing.assert_close(weights, router_logits.softmax(dim=-1)[:, [4, 5]])


def test_grouped_routing_never_leaves_the_chosen_groups() -> None:
    # Group 0 (experts 0-3) has the two best biased scores; expert 4 alone is the best.
    router_logits = torch.tensor([[3.0, 2.9, -9.0, -9.0, 9.0, -9.0, -9.0, -9.0]])
    weights, ids = grouped_sigmoid_topk_routing(
        router_logits,
        torch.zeros(8),
        2,
        num_groups=2,
        topk_groups=1,
        renormalize=True,
    )
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("top_k", [0, NUM_EXPERTS + 1])
def test_top_k_out_of_range(top_k: int) -> None:
    with pytest.raises(ValueError, match=r"top_k must be in 1\.\.8"):
        softmax_topk_routing(TIED_LOGITS, top_k, renormalize=True)


def test_groups_must_divide_the_experts() -> None:
    with pytest.raises(ValueError, match="8 experts cannot form 3 equal groups"):
        grouped_sigmoid_topk_routing(
            TIED_LOGITS, torch.zeros(8), 2, num_groups=3, topk_groups=1, renormalize=True
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_experts", "top_k"), [(8, 2), (64, 6), (256, 8)])
def test_ties_go_to_the_lower_expert_id(dtype: torch.dtype, num_experts: int, top_k: int) -> None:
    """Logits on a coarse grid, so most rows tie at the top-k boundary; every router, every
    row, follows the one rule the CUDA kernels follow (checked in plain Python)."""
    generator = torch.Generator().manual_seed(num_experts)
    logits = torch.randint(0, 4, (64, num_experts), generator=generator).to(dtype)
    _, ids = softmax_topk_routing(logits, top_k, renormalize=False)
    assert torch.equal(ids, lower_id_first(logits.float(), top_k))
    num_groups = 4
    _, grouped_ids = TorchBackend().grouped_softmax_topk_routing(
        logits, top_k, num_groups=num_groups, topk_groups=num_groups
    )
    assert torch.equal(grouped_ids, ids)
    bias = torch.zeros(num_experts)
    _, sigmoid_ids = grouped_sigmoid_topk_routing(
        logits, bias, top_k, num_groups=num_groups, topk_groups=num_groups, renormalize=True
    )
    assert torch.equal(sigmoid_ids, ids)  # sigmoid keeps softmax's order, ties included
    # Groups tie too: the lowest group holding the best score wins, then its lowest expert.
    _, limited = TorchBackend().grouped_softmax_topk_routing(
        logits, 1, num_groups=num_groups, topk_groups=1
    )
    assert torch.equal(limited, lower_id_first(logits.float(), 1))
