"""The cupy backend's kernels for ``softmax_topk_routing`` and ``grouped_sigmoid_topk_routing``
(``kernels/moe_routing.cu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import launch as cuda
from metrale_kernels.cuda.launch import f32, i32, i64, ptr
from metrale_kernels.op import kernel

if TYPE_CHECKING:
    from metrale_kernels.cuda.backend import CupyBackend

MAX_EXPERTS = 32 * 16
ROUTING_WARPS = 4


@kernel(KernelBackend.softmax_topk_routing)
def softmax_topk_routing(
    backend: CupyBackend, router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    suffix = cuda.dtype_suffix(router_logits.dtype)
    num_experts = router_logits.shape[-1]
    if (
        not cuda.on_cuda(router_logits)
        or suffix is None
        or router_logits.dim() != 2
        or num_experts > MAX_EXPERTS
        or not 0 < top_k <= num_experts
    ):
        return backend.fallback(
            KernelBackend.softmax_topk_routing, f"{num_experts} experts, top {top_k}"
        )(router_logits, top_k, renormalize)
    logits = router_logits.contiguous()
    num_tokens = logits.shape[0]
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=logits.device)
    if num_tokens:
        cuda.launch(
            "moe_routing",
            f"softmax_topk_{suffix}",
            logits.device,
            (-(-num_tokens // ROUTING_WARPS),),
            (32 * ROUTING_WARPS,),
            (
                ptr(weights),
                ptr(ids),
                ptr(logits),
                i64(num_tokens),
                i32(num_experts),
                i32(top_k),
                i32(int(renormalize)),
            ),
        )
    return weights, ids


@kernel(KernelBackend.grouped_sigmoid_topk_routing)
def grouped_sigmoid_topk_routing(
    backend: CupyBackend,
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    *,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    suffix = cuda.dtype_suffix(router_logits.dtype)
    num_experts = router_logits.shape[-1]
    if (
        not cuda.on_cuda(router_logits)
        or suffix is None
        or router_logits.dim() != 2
        or num_experts > MAX_EXPERTS
        or not 0 < num_groups <= 32
        or num_experts % num_groups
        or not 0 < topk_groups <= num_groups
        or not 0 < top_k <= topk_groups * (num_experts // num_groups)
    ):
        # The reference also raises the contract's errors.
        return backend.fallback(
            KernelBackend.grouped_sigmoid_topk_routing,
            f"{num_experts} experts, {num_groups} groups",
        )(
            router_logits,
            correction_bias,
            top_k,
            num_groups=num_groups,
            topk_groups=topk_groups,
            renormalize=renormalize,
            routed_scaling_factor=routed_scaling_factor,
        )
    logits = router_logits.contiguous()
    bias = correction_bias.to(torch.float32).contiguous()
    num_tokens = logits.shape[0]
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=logits.device)
    if num_tokens:
        cuda.launch(
            "moe_routing",
            f"grouped_sigmoid_topk_{suffix}",
            logits.device,
            (-(-num_tokens // ROUTING_WARPS),),
            (32 * ROUTING_WARPS,),
            (
                ptr(weights),
                ptr(ids),
                ptr(logits),
                ptr(bias),
                i64(num_tokens),
                i32(num_experts),
                i32(top_k),
                i32(num_groups),
                i32(topk_groups),
                i32(int(renormalize)),
                f32(routed_scaling_factor),
            ),
            shared_mem_bytes=4 * ROUTING_WARPS * num_experts,
        )
    return weights, ids
