"""Reference MoE routers: which ``top_k`` experts each token goes to, and with what weight.

Equal scores go to the lower expert id, for experts and for groups alike, on every backend
(:mod:`~metrale_kernels.reference.ranked`); transformers' ``torch.topk`` leaves that order open,
so on a tie ours may route elsewhere than transformers on the same device, with the same
weights. Each returns ``(topk_weights, topk_ids)``: ``(tokens, top_k)`` float32 (float64 for
float64 logits) and int64, each row in descending order of the score the experts were chosen by.
"""

from __future__ import annotations

import torch

from metrale_kernels.compute_dtype import widened
from metrale_kernels.reference.ranked import top_k_lower_index_first


def _check_top_k(router_logits: torch.Tensor, top_k: int) -> None:
    num_experts = router_logits.shape[-1]
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts} (the number of experts), got {top_k}")


def softmax_topk_routing(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over ``router_logits (tokens, experts)`` in float32, then ``torch.topk``.

    Mixtral (``renormalize=True``) and Qwen3-MoE (``renormalize=norm_topk_prob``): with
    ``renormalize`` the chosen probabilities are divided by their sum.
    """
    _check_top_k(router_logits, top_k)
    probs = widened(router_logits).softmax(dim=-1)
    topk_weights, topk_ids = top_k_lower_index_first(probs, top_k)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids


def grouped_softmax_topk_routing(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    num_groups: int,
    topk_groups: int,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2 routing: softmax over ``router_logits (tokens, experts)`` in float32, the
    ``top_k`` experts of highest probability among the ``topk_groups`` groups (of
    ``num_groups`` equal ones) whose best probability is highest; ``num_groups == 1`` is V2's
    ``greedy``. The weights are the chosen probabilities, not renormalized, times
    ``routed_scaling_factor``.
    """
    _check_top_k(router_logits, top_k)
    num_tokens, num_experts = router_logits.shape
    _check_groups(num_experts, top_k, num_groups, topk_groups)
    probs = widened(router_logits).softmax(dim=-1)
    candidates = probs
    if topk_groups < num_groups:
        # (tokens, groups, experts_per_group)
        grouped = probs.view(num_tokens, num_groups, -1)
        group_ids = top_k_lower_index_first(grouped.amax(dim=-1), topk_groups)[1]
        group_mask = torch.zeros(grouped.shape[:2], dtype=torch.bool, device=probs.device)
        group_mask.scatter_(1, group_ids, True)
        candidates = grouped.masked_fill(~group_mask[..., None], -1.0).view_as(probs)
    topk_ids = top_k_lower_index_first(candidates, top_k)[1]
    return probs.gather(1, topk_ids) * routed_scaling_factor, topk_ids


def _check_groups(num_experts: int, top_k: int, num_groups: int, topk_groups: int) -> None:
    if num_groups < 1 or num_experts % num_groups:
        raise ValueError(f"{num_experts} experts cannot form {num_groups} equal groups")
    if not 0 < topk_groups <= num_groups:
        raise ValueError(f"topk_groups must be in 1..{num_groups}, got {topk_groups}")
    if top_k > topk_groups * (num_experts // num_groups):
        raise ValueError(f"top_k {top_k} exceeds the experts of {topk_groups} groups")


def grouped_sigmoid_topk_routing(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    *,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 / GLM routing: sigmoid scores, group-limited top-k on the biased scores.

    Experts ``(tokens, experts)`` split into ``num_groups`` equal groups; a group scores the sum
    of its two best biased scores ``sigmoid(logit) + correction_bias``; each token picks among
    the experts of its ``topk_groups`` best groups the ``top_k`` of highest biased score. The
    weights are the unbiased sigmoid scores of those experts, divided by their sum (plus
    1e-20) when ``renormalize``, times ``routed_scaling_factor``.
    """
    _check_top_k(router_logits, top_k)
    num_tokens, num_experts = router_logits.shape
    _check_groups(num_experts, top_k, num_groups, topk_groups)
    scores = widened(router_logits).sigmoid()
    biased = scores + correction_bias.to(scores.dtype)
    if topk_groups < num_groups:
        # (tokens, groups, experts_per_group)
        grouped = biased.view(num_tokens, num_groups, -1)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
        group_ids = top_k_lower_index_first(group_scores, topk_groups)[1]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_ids, True)
        biased = grouped.masked_fill(~group_mask[..., None], float("-inf")).view_as(biased)
    topk_ids = top_k_lower_index_first(biased, top_k)[1]
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_weights * routed_scaling_factor, topk_ids
