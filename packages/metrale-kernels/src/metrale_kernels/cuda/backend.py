"""``CupyBackend``: the ops with CUDA kernels, each falling back to the torch reference for an
input its kernel does not take (said once per op and reason in a debug line)."""

from __future__ import annotations

import logging

import torch

from metrale_kernels.attention_metadata import AttentionMetadata
from metrale_kernels.backend import KernelBackend
from metrale_kernels.cuda import attention_rows
from metrale_kernels.cuda.launch import dtype_suffix, f32, i32, i64, import_cupy, launch, ptr

logger = logging.getLogger("metrale.kernels")

ATTENTION_THREADS = 128
ATTENTION_TILE = 32
MAX_ACCUMULATORS = 16
MAX_SHARED_BYTES = 48 * 1024
MAX_EXPERTS = 32 * 16
ROUTING_WARPS = 4
DSA_THREADS = 128
DSA_TILE = 16
DSA_MAX_ACCUMULATORS = 16
INDEXER_THREADS = 128
SELECT_THREADS = 256
SELECT_MAX_POOLS = 4096
INDEXER_TILE = 32
# Rows per paged attention launch: bounds the float32 split partials.
PARTIAL_BUDGET_BYTES = 64 * 2**20


def _on_cuda(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def _attention_shared_bytes(group: int, head_dim: int) -> int:
    floats = group * head_dim + ATTENTION_TILE * (head_dim + 1) + group * ATTENTION_TILE + 3 * group
    return 4 * floats


def _dsa_shared_bytes(heads_per_block: int, rank: int) -> int:
    floats = heads_per_block * (rank + DSA_TILE + 3) + DSA_TILE * (rank + 1)
    return 4 * floats


def _dsa_heads_per_block(num_heads: int, rank: int) -> int | None:
    """The most heads one block can hold (accumulators and shared memory); ``None``: not one."""
    heads = min(num_heads, DSA_MAX_ACCUMULATORS * DSA_THREADS // rank)
    # The kernel's static shared memory: one slot id per tile position.
    while heads > 0 and _dsa_shared_bytes(heads, rank) > MAX_SHARED_BYTES - 8 * DSA_TILE:
        heads -= 1
    return heads or None


def _norm_threads(hidden: int) -> int:
    return min(256, 32 * -(-hidden // 32))


class CupyBackend(KernelBackend):
    """CUDA kernels through CuPy (see :mod:`metrale_kernels.cuda.sources`); every op it has no
    kernel for is the reference. Raises :class:`~metrale_kernels.cuda.launch.CupyUnavailableError`
    when CuPy cannot run here."""

    name = "cupy"

    def __init__(self) -> None:
        import_cupy()
        self._fallbacks_logged: set[tuple[str, str]] = set()
        inherited = sorted(
            name
            for name, member in vars(KernelBackend).items()
            if callable(member) and not name.startswith("_") and name not in vars(CupyBackend)
        )
        logger.debug("cupy backend: the torch reference runs %s", ", ".join(inherited))

    def _fallback(self, op: str, reason: str) -> None:
        if (op, reason) not in self._fallbacks_logged:
            self._fallbacks_logged.add((op, reason))
            logger.debug("cupy backend: %s falls back to the torch reference: %s", op, reason)

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        suffix = dtype_suffix(x.dtype)
        if not _on_cuda(x) or suffix is None or weight.dtype != x.dtype or x.dim() > 3:
            self._fallback("rms_norm", f"{x.dtype} x, {weight.dtype} weight, {x.dim()} dims")
            return super().rms_norm(x, weight, eps, out=out)
        hidden = x.shape[-1]
        if x.stride(-1) != 1:
            x = x.contiguous()
        # (outer, inner, hidden), the last dim dense.
        view = x if x.dim() == 3 else x.view(1, 1, hidden) if x.dim() == 1 else x.unsqueeze(1)
        outer, inner = view.shape[0], view.shape[1]
        result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if view.numel():
            launch(
                "norms",
                f"rms_norm_{suffix}",
                x.device,
                (outer * inner,),
                (_norm_threads(hidden),),
                (
                    ptr(result),
                    ptr(view),
                    ptr(weight.contiguous()),
                    i32(inner),
                    i64(view.stride(0)),
                    i64(view.stride(1)),
                    i32(hidden),
                    f32(eps),
                ),
            )
        return _into(result, out)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        suffix = dtype_suffix(x.dtype)
        if (
            not _on_cuda(x)
            or suffix is None
            or not (weight.dtype == residual.dtype == x.dtype)
            or x.shape != residual.shape
        ):
            self._fallback("add_rms_norm", f"{x.dtype} x, {residual.dtype} residual")
            return super().add_rms_norm(x, residual, weight, eps)
        hidden = x.shape[-1]
        x, residual = x.contiguous(), residual.contiguous()
        normed = torch.empty_like(x)
        summed = torch.empty_like(x)
        if x.numel():
            launch(
                "norms",
                f"add_rms_norm_{suffix}",
                x.device,
                (x.numel() // hidden,),
                (_norm_threads(hidden),),
                (
                    ptr(normed),
                    ptr(summed),
                    ptr(x),
                    ptr(residual),
                    ptr(weight.contiguous()),
                    i32(hidden),
                    f32(eps),
                ),
            )
        return normed, summed

    def silu_and_mul(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        suffix = dtype_suffix(x.dtype)
        if not _on_cuda(x) or suffix is None:
            self._fallback("silu_and_mul", f"{x.dtype} on {x.device.type}")
            return super().silu_and_mul(x, out=out)
        width = x.shape[-1]
        rows2d = x if x.dim() == 2 and x.stride(-1) == 1 else x.contiguous().view(-1, width)
        num_rows, d = rows2d.shape[0], width // 2
        result = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
        total = num_rows * d
        if total:
            launch(
                "activation",
                f"silu_and_mul_{suffix}",
                x.device,
                (min(-(-total // 256), 16384),),
                (256,),
                (ptr(result), ptr(rows2d), i64(num_rows), i32(d), i64(rows2d.stride(0))),
            )
        return _into(result, out)

    def apply_rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        suffix = dtype_suffix(q.dtype)
        head_dim = q.shape[-1]
        if (
            not _on_cuda(q)
            or suffix is None
            or k.dtype != q.dtype
            or q.dim() != 3
            or k.dim() != 3
            or cos_sin_cache.dtype != torch.float32
            or cos_sin_cache.shape[-1] != head_dim
            or k.shape[-1] != head_dim
        ):
            self._fallback("apply_rotary", f"{q.dtype} q of {q.dim()} dims, {cos_sin_cache.dtype}")
            return super().apply_rotary(q, k, positions, cos_sin_cache)
        q = q if q.stride(-1) == 1 else q.contiguous()
        k = k if k.stride(-1) == 1 else k.contiguous()
        q_out, k_out = (
            torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
        )
        if q.shape[0]:
            launch(
                "rotary",
                f"rotary_{suffix}",
                q.device,
                (q.shape[0],),
                (128,),
                (
                    ptr(q_out),
                    ptr(k_out),
                    ptr(q),
                    ptr(k),
                    ptr(positions.to(torch.int64).contiguous()),
                    ptr(cos_sin_cache.contiguous()),
                    i32(q.shape[1]),
                    i32(k.shape[1]),
                    i32(head_dim),
                    i64(q.stride(0)),
                    i64(q.stride(1)),
                    i64(k.stride(0)),
                    i64(k.stride(1)),
                ),
            )
        return q_out, k_out

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        suffix = dtype_suffix(k_cache.dtype)
        if (
            not _on_cuda(k_cache)
            or suffix is None
            or not (key.dtype == value.dtype == k_cache.dtype == v_cache.dtype)
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        ):
            self._fallback("write_kv", f"{key.dtype} keys into a {k_cache.dtype} cache")
            super().write_kv(key, value, k_cache, v_cache, slot_mapping)
            return
        num_kv_heads, head_dim = k_cache.shape[-2:]
        key = key if key.stride(-1) == 1 else key.contiguous()
        value = value if value.stride(-1) == 1 else value.contiguous()
        if key.shape[0]:
            launch(
                "kv_write",
                f"write_kv_{suffix}",
                k_cache.device,
                (key.shape[0],),
                (128,),
                (
                    ptr(k_cache),
                    ptr(v_cache),
                    ptr(key),
                    ptr(value),
                    ptr(slot_mapping.to(torch.int64).contiguous()),
                    i32(num_kv_heads),
                    i32(head_dim),
                    i64(key.stride(0)),
                    i64(key.stride(1)),
                    i64(value.stride(0)),
                    i64(value.stride(1)),
                ),
            )

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        if num_heads % num_kv_heads or (sliding_window is not None and sliding_window < 1):
            # The reference raises the contract's ValueError.
            return super().paged_attention(
                q, k_cache, v_cache, metadata, scale, sliding_window, out=out
            )
        suffix = dtype_suffix(q.dtype)
        group = num_heads // num_kv_heads
        if (
            not _on_cuda(q)
            or suffix is None
            or not (q.dtype == k_cache.dtype == v_cache.dtype)
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())
            or group * head_dim > MAX_ACCUMULATORS * ATTENTION_THREADS
            or _attention_shared_bytes(group, head_dim) > MAX_SHARED_BYTES
        ):
            self._fallback(
                "paged_attention",
                f"{q.dtype} q over a {k_cache.dtype} cache, {group} x {head_dim} per kv head",
            )
            return super().paged_attention(
                q, k_cache, v_cache, metadata, scale, sliding_window, out=out
            )
        q = q if q.stride(-1) == 1 else q.contiguous()
        result = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
        rows = attention_rows.attention_rows(metadata, sliding_window)
        if num_tokens:
            _paged_attention_launches(
                result, q, k_cache, v_cache, metadata, rows, scale, sliding_window, suffix
            )
        return _into(result, out)

    def softmax_topk_routing(
        self, router_logits: torch.Tensor, top_k: int, renormalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        suffix = dtype_suffix(router_logits.dtype)
        num_experts = router_logits.shape[-1]
        if (
            not _on_cuda(router_logits)
            or suffix is None
            or router_logits.dim() != 2
            or num_experts > MAX_EXPERTS
            or not 0 < top_k <= num_experts
        ):
            self._fallback("softmax_topk_routing", f"{num_experts} experts, top {top_k}")
            return super().softmax_topk_routing(router_logits, top_k, renormalize)
        logits = router_logits.contiguous()
        num_tokens = logits.shape[0]
        weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=logits.device)
        ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=logits.device)
        if num_tokens:
            launch(
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

    def grouped_sigmoid_topk_routing(
        self,
        router_logits: torch.Tensor,
        correction_bias: torch.Tensor,
        top_k: int,
        *,
        num_groups: int,
        topk_groups: int,
        renormalize: bool,
        routed_scaling_factor: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        suffix = dtype_suffix(router_logits.dtype)
        num_experts = router_logits.shape[-1]
        if (
            not _on_cuda(router_logits)
            or suffix is None
            or router_logits.dim() != 2
            or num_experts > MAX_EXPERTS
            or not 0 < num_groups <= 32
            or num_experts % num_groups
            or not 0 < topk_groups <= num_groups
            or not 0 < top_k <= topk_groups * (num_experts // num_groups)
        ):
            # The reference also raises the contract's errors.
            self._fallback(
                "grouped_sigmoid_topk_routing", f"{num_experts} experts, {num_groups} groups"
            )
            return super().grouped_sigmoid_topk_routing(
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
            launch(
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

    def pool_index_keys(self, keys: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        suffix = dtype_suffix(keys.dtype)
        if (
            not _on_cuda(keys)
            or suffix is None
            or gate_logits.dtype != keys.dtype
            or keys.dim() != 3
            or gate_logits.shape != keys.shape
        ):
            self._fallback("pool_index_keys", f"{keys.dtype} keys, {gate_logits.dtype} logits")
            return super().pool_index_keys(keys, gate_logits)
        keys, gate_logits = keys.contiguous(), gate_logits.contiguous()
        num_pools, pool, dim = keys.shape
        out = torch.empty((num_pools, dim), dtype=torch.float32, device=keys.device)
        total = num_pools * dim
        if total and pool:
            launch(
                "dsa_indexer",
                f"pool_index_keys_{suffix}",
                keys.device,
                (-(-total // 256),),
                (256,),
                (ptr(out), ptr(keys), ptr(gate_logits), i64(num_pools), i32(pool), i32(dim)),
            )
        elif total:
            return super().pool_index_keys(keys, gate_logits)
        return out

    def select_positions(
        self,
        scores: torch.Tensor,
        positions: torch.Tensor,
        *,
        kpool: int,
        topk_pools: int,
        select_tail: bool,
    ) -> torch.Tensor:
        num_queries, num_pools = scores.shape
        complete = int(((positions.long() + 1) // max(kpool, 1)).max()) if num_queries else 0
        if (
            not _on_cuda(scores)
            or kpool < 1
            or topk_pools < 1
            or num_pools > SELECT_MAX_POOLS
            or complete > num_pools
        ):
            # The reference raises the contract's errors.
            self._fallback("select_positions", f"{num_pools} pools, kpool {kpool}")
            return super().select_positions(
                scores, positions, kpool=kpool, topk_pools=topk_pools, select_tail=select_tail
            )
        width = topk_pools * kpool + max(kpool - 1, 0)
        out = torch.empty((num_queries, width), dtype=torch.int64, device=scores.device)
        ranked = scores.to(torch.float32)
        ranked = ranked if ranked.stride(-1) == 1 else ranked.contiguous()
        if num_queries:
            launch(
                "dsa_select",
                "select_positions",
                scores.device,
                (num_queries,),
                (SELECT_THREADS,),
                (
                    ptr(out),
                    ptr(ranked),
                    ptr(positions.to(torch.int64).contiguous()),
                    i64(ranked.stride(0)),
                    i32(kpool),
                    i32(topk_pools),
                    i32(min(topk_pools, num_pools)),
                    i32(int(select_tail)),
                    i32(width),
                ),
            )
        return out

    def index_scores(
        self,
        index_q: torch.Tensor,
        head_weights: torch.Tensor,
        pooled_keys: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        suffix = dtype_suffix(index_q.dtype)
        num_queries, num_heads, dim = index_q.shape
        num_pools = pooled_keys.shape[0]
        shared_bytes = 4 * (INDEXER_TILE * (dim + 1) + INDEXER_THREADS // 32 * INDEXER_TILE)
        if not _on_cuda(index_q) or suffix is None or shared_bytes > MAX_SHARED_BYTES:
            self._fallback("index_scores", f"{index_q.dtype} queries of dim {dim}")
            return super().index_scores(index_q, head_weights, pooled_keys, scale)
        q = index_q.contiguous()
        weights = head_weights.to(torch.float32).contiguous()
        keys = pooled_keys.to(torch.float32).contiguous()
        scores = torch.empty((num_queries, num_pools), dtype=torch.float32, device=q.device)
        if num_queries and num_pools:
            launch(
                "dsa_indexer",
                f"index_scores_{suffix}",
                q.device,
                (num_queries, -(-num_pools // INDEXER_TILE)),
                (INDEXER_THREADS,),
                (
                    ptr(scores),
                    ptr(q),
                    ptr(weights),
                    ptr(keys),
                    i32(num_pools),
                    i32(num_heads),
                    i32(dim),
                    f32(scale),
                ),
                shared_mem_bytes=shared_bytes,
            )
        return scores

    def sparse_latent_attention(
        self,
        q: torch.Tensor,
        latent_cache: torch.Tensor,
        block_table: torch.Tensor,
        selected: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        suffix = dtype_suffix(q.dtype)
        num_queries, num_heads, rank = q.shape
        heads_per_block = _dsa_heads_per_block(num_heads, rank)
        if (
            not _on_cuda(q)
            or suffix is None
            or latent_cache.dtype != q.dtype
            or not latent_cache.is_contiguous()
            or heads_per_block is None
        ):
            self._fallback("sparse_latent_attention", f"{q.dtype} q, rank {rank}")
            return super().sparse_latent_attention(q, latent_cache, block_table, selected, scale)
        q = q.contiguous()
        chosen = selected.to(torch.int64).contiguous()
        out = torch.empty_like(q)
        if num_queries and num_heads:
            launch(
                "dsa",
                f"sparse_latent_attention_{suffix}",
                q.device,
                (num_queries, -(-num_heads // heads_per_block)),
                (DSA_THREADS,),
                (
                    ptr(out),
                    ptr(q),
                    ptr(latent_cache),
                    ptr(block_table.to(torch.int64).contiguous()),
                    ptr(chosen),
                    i32(num_heads),
                    i32(heads_per_block),
                    i32(rank),
                    i32(latent_cache.shape[1]),
                    i32(chosen.shape[1]),
                    f32(scale),
                ),
                shared_mem_bytes=_dsa_shared_bytes(heads_per_block, rank),
            )
        return out


def _into(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    return out.copy_(result)


def _paged_attention_launches(
    result: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    rows: attention_rows.AttentionRows,
    scale: float,
    sliding_window: int | None,
    suffix: str,
) -> None:
    """Both passes over the rows, in chunks whose partials fit ``PARTIAL_BUDGET_BYTES``."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    max_splits = rows.max_splits
    row_bytes = 4 * num_heads * max_splits * (head_dim + 2)
    chunk = max(1, min(num_tokens, PARTIAL_BUDGET_BYTES // row_bytes))
    part_acc = torch.empty(
        (chunk, num_heads, max_splits, head_dim), dtype=torch.float32, device=q.device
    )
    part_ml = torch.empty((chunk, num_heads, max_splits, 2), dtype=torch.float32, device=q.device)
    window = 0 if sliding_window is None else sliding_window
    per_vector = 16 // q.element_size()
    vector_loads = head_dim % per_vector == 0 and all(
        cache.data_ptr() % 16 == 0 for cache in (k_cache, v_cache)
    )
    tables = metadata.block_tables
    if tables.stride(-1) != 1:
        tables = tables.contiguous()
    for start in range(0, num_tokens, chunk):
        stop = min(num_tokens, start + chunk)
        row_seq, row_pos = rows.row_seq[start:stop], rows.row_pos[start:stop]
        launch(
            "paged_attention",
            f"paged_attention_partial_{suffix}",
            q.device,
            (stop - start, num_kv_heads, max_splits),
            (ATTENTION_THREADS,),
            (
                ptr(part_acc),
                ptr(part_ml),
                ptr(q[start:stop]),
                ptr(k_cache),
                ptr(v_cache),
                ptr(tables),
                i64(tables.stride(0)),
                ptr(row_seq),
                ptr(row_pos),
                i32(num_heads),
                i32(num_kv_heads),
                i32(head_dim),
                i32(block_size),
                i64(q.stride(0)),
                i64(q.stride(1)),
                f32(scale),
                i32(window),
                i32(attention_rows.SPLIT_KEYS),
                i32(max_splits),
                i32(int(vector_loads)),
            ),
            shared_mem_bytes=_attention_shared_bytes(group, head_dim),
        )
        launch(
            "paged_attention",
            f"paged_attention_combine_{suffix}",
            q.device,
            (stop - start, num_heads),
            (min(ATTENTION_THREADS, 32 * -(-head_dim // 32)),),
            (
                ptr(result[start:stop]),
                ptr(part_acc),
                ptr(part_ml),
                ptr(row_pos),
                i32(num_heads),
                i32(head_dim),
                i32(window),
                i32(attention_rows.SPLIT_KEYS),
                i32(max_splits),
                i64(result.stride(0)),
                i64(result.stride(1)),
            ),
        )
