"""The reference backend: plain torch, runs on any device, the numerics every other backend matches."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from metrale_kernels.attention_metadata import AttentionMetadata


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _causal_mask(
    query_len: int, seq_len: int, sliding_window: int | None, device: torch.device
) -> torch.Tensor:
    """``(query_len, seq_len)`` True where a query may attend to a key."""
    query_pos = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
    key_pos = torch.arange(seq_len, device=device)[None, :]
    allowed = key_pos <= query_pos
    if sliding_window is not None:
        allowed &= key_pos > query_pos - sliding_window
    return allowed


class TorchBackend:
    """Reference ops in torch; also the production path on CPU."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
        return weight * normed.to(x.dtype)

    def apply_rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos_half, sin_half = cos_sin_cache[positions].chunk(2, dim=-1)
        # (tokens, 1, head_dim): one angle per position, shared by every head.
        cos = torch.cat([cos_half, cos_half], dim=-1).unsqueeze(1)
        sin = torch.cat([sin_half, sin_half], dim=-1).unsqueeze(1)
        return _rotate(q, cos.to(q.dtype), sin.to(q.dtype)), _rotate(k, cos.to(k.dtype), sin.to(k.dtype))

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        num_kv_heads, head_dim = k_cache.shape[-2:]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        if metadata.is_decode_only and sliding_window is None:
            return self._decode(q, k_cache, v_cache, metadata, scale)
        return self._ragged(q, k_cache, v_cache, metadata, scale, sliding_window)

    def _gather(self, cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
        """``(length, kv_heads, head_dim)`` of one sequence's context, in position order."""
        num_blocks = -(-length // cache.shape[1])
        return cache[block_table[:num_blocks]].flatten(0, 1)[:length]

    def _ragged(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        num_kv_heads = k_cache.shape[2]
        out = torch.empty_like(q)
        start = 0
        for i, (query_len, seq_len) in enumerate(zip(metadata.query_lens, metadata.seq_lens, strict=True)):
            # (heads, tokens, head_dim) for SDPA; kv heads repeated for grouped-query attention.
            query = q[start : start + query_len].transpose(0, 1)
            keys = self._gather(k_cache, metadata.block_tables[i], seq_len).transpose(0, 1)
            values = self._gather(v_cache, metadata.block_tables[i], seq_len).transpose(0, 1)
            group = query.shape[0] // num_kv_heads
            keys = keys.repeat_interleave(group, dim=0).to(q.dtype)
            values = values.repeat_interleave(group, dim=0).to(q.dtype)
            mask = _causal_mask(query_len, seq_len, sliding_window, q.device)
            attended = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale)
            out[start : start + query_len] = attended.transpose(0, 1)
            start += query_len
        return out

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        num_seqs, (num_heads, head_dim) = metadata.num_seqs, q.shape[1:]
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        max_len = metadata.max_seq_len
        num_blocks = -(-max_len // metadata.block_size)
        tables = metadata.block_tables[:, :num_blocks]
        # (seqs, kv_heads, max_len, head_dim)
        keys = k_cache[tables].flatten(1, 2)[:, :max_len].transpose(1, 2).to(q.dtype)
        values = v_cache[tables].flatten(1, 2)[:, :max_len].transpose(1, 2).to(q.dtype)
        # (seqs, kv_heads, group, head_dim)
        query = q.view(num_seqs, num_kv_heads, group, head_dim)
        scores = torch.matmul(query, keys.transpose(-1, -2)) * scale
        valid = torch.arange(max_len, device=q.device)[None, :] < metadata.seq_lens_tensor[:, None]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, values).view(num_seqs, num_heads, head_dim)
