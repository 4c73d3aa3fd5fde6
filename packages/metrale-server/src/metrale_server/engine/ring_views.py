"""The step as sliding-window layers in rings address their K/V (see
:mod:`metrale_model_arch.sliding_window_ring`): block tables and slot mapping derived from each
sequence's state slot, one view per ringed window, carried by the step's metadata."""

from __future__ import annotations

import attrs
import torch

from metrale_kernels import AttentionMetadata


def ring_view(metadata: AttentionMetadata, ring_blocks: int) -> AttentionMetadata:
    """``metadata`` as a ring of ``ring_blocks`` blocks per state slot addresses it: sequence
    ``i`` in slot ``s`` finds its logical block ``j`` at ``s * ring_blocks + j mod
    ring_blocks``, and writes position ``p`` at slot ``s * ring_tokens + p mod ring_tokens``."""
    slots = metadata.state_slots
    if slots is None:
        raise ValueError("a ring view needs the step's state slots")
    block_size = metadata.block_size
    ring_tokens = ring_blocks * block_size
    device = metadata.block_tables.device
    columns = torch.arange(metadata.block_tables.shape[1], device=device)
    tables = slots[:, None] * ring_blocks + columns % ring_blocks
    query_lens = metadata.query_start_loc.diff()
    rows = torch.repeat_interleave(torch.arange(len(slots), device=device), query_lens)
    firsts = metadata.seq_lens_tensor - query_lens
    offsets = torch.arange(len(rows), device=device) - metadata.query_start_loc[rows]
    positions = firsts[rows] + offsets
    slot_mapping = slots[rows] * ring_tokens + positions % ring_tokens
    return attrs.evolve(metadata, slot_mapping=slot_mapping, block_tables=tables, window_views={})


def with_ring_views(metadata: AttentionMetadata, windows: dict[int, int]) -> AttentionMetadata:
    """``metadata`` carrying a ring view for each window of ``windows`` (window -> ring
    blocks per slot); itself when there are none."""
    if not windows:
        return metadata
    views = {window: ring_view(metadata, blocks) for window, blocks in windows.items()}
    return attrs.evolve(metadata, window_views=views)
