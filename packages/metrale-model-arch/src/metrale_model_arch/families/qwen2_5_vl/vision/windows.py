"""The windows Qwen2.5-VL's tower attends within: squares of merge blocks, frame by frame.

A frame's merge blocks (``spatial_merge_size`` squared patches) are tiled by windows of
``window_blocks`` blocks a side from its top-left corner (those on the right and bottom edges cut
short), window row by window row; the tower runs its patches window by window, each window's
blocks in row order (transformers' ``get_vision_window_index``).
"""

from __future__ import annotations

import math

import attrs
import torch


@attrs.frozen(kw_only=True, eq=False)
class WindowOrder:
    """``blocks (num_blocks,)`` int64: the merge blocks of all images (numbered in
    ``pixel_values``' order) in window order; ``window_sizes``: each window's merge blocks."""

    blocks: torch.Tensor
    window_sizes: list[int]


def window_order(grid_thw: torch.Tensor, merge_size: int, window_blocks: int) -> WindowOrder:
    orders, sizes, first_block = [], [], 0
    for frames, height, width in grid_thw.tolist():
        rows, cols = height // merge_size, width // merge_size
        window_rows, window_cols = math.ceil(rows / window_blocks), math.ceil(cols / window_blocks)
        frame, row, col = torch.meshgrid(
            torch.arange(frames), torch.arange(rows), torch.arange(cols), indexing="ij"
        )
        window_row, window_col = row // window_blocks, col // window_blocks
        window = ((frame * window_rows + window_row) * window_cols + window_col).flatten()
        orders.append(torch.argsort(window, stable=True) + first_block)
        sizes += torch.bincount(window, minlength=frames * window_rows * window_cols).tolist()
        first_block += frames * rows * cols
    return WindowOrder(blocks=torch.cat(orders), window_sizes=sizes)
