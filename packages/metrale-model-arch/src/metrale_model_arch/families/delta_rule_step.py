"""One step of a delta-rule linear-attention layer over the sequences' state slots, shared by
KDA (GLM-5.3, Kimi Linear: a gate per channel) and Gated DeltaNet (Qwen3-Next: a gate per head):
the short causal convolution over the mixed q | k | v channels, then the recurrence."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional

from metrale_kernels import AttentionMetadata, KernelBackend

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def delta_rule_over_slots(
    backend: KernelBackend,
    mixed: torch.Tensor,
    conv_weight: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: tuple[torch.Tensor, ...],
    metadata: AttentionMetadata,
    split: Callable[[torch.Tensor], QKV],
) -> torch.Tensor:
    """``mixed (tokens, channels)`` convolved by ``conv_weight (channels, K)``, ``split`` into
    q, k, v, and run through the delta rule with log-decay ``g`` and strength ``beta``; the
    layer's ``state`` ``(recurrent (slots, H, dk, dv), conv (slots, channels, K - 1))`` is
    updated in place at each sequence's slot. One batched step when every sequence decodes,
    else each sequence's rows in chunks. Returns ``(tokens, H, dv)`` in the compute dtype."""
    recurrent, conv = state
    slots = metadata.state_slots
    if slots is None:
        raise ValueError("a linear-attention layer needs metadata.state_slots")
    if metadata.is_decode_only:
        history = conv.index_select(0, slots)
        window = torch.cat([history, mixed.to(history.dtype).unsqueeze(-1)], dim=-1)
        conv.index_copy_(0, slots, window[:, :, 1:])
        q, k, v = split(functional.silu((window * conv_weight).sum(dim=-1)))
        states = recurrent.index_select(0, slots)
        out = backend.kda_decode_step(q, k, v, g, beta, states)
        recurrent.index_copy_(0, slots, states)
        return out
    outs = []
    starts = metadata.query_start_loc.tolist()
    for i, slot in enumerate(slots.tolist()):
        rows = slice(starts[i], starts[i + 1])
        conv_out, conv[slot] = backend.short_conv(mixed[rows], conv_weight, conv[slot])
        q, k, v = split(conv_out)
        o, recurrent[slot] = backend.kda_chunked(q, k, v, g[rows], beta[rows], recurrent[slot])
        outs.append(o)
    return torch.cat(outs)
