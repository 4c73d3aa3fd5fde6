"""A prompt's M-RoPE positions (transformers' ``get_rope_index``) and the delta decoding
continues from.

Text counts on one position a token, the same in all three rows. An image's tokens (its merged
patches, frame by frame, row by row) take ``start + (frame, row, column)``, ``start`` the position
after the text before it; the text after it continues at ``start + max(rows, columns)``. A token
after the prompt at sequence index ``i`` takes position ``i + delta`` in every row, ``delta``
being the prompt's largest position plus one, less its length (zero for text alone).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_model_arch.prompt_positions import PromptPositions


def prompt_positions(
    input_ids: Sequence[int] | torch.Tensor,
    grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    merge_size: int,
) -> PromptPositions:
    """The positions of a prompt whose images (``grid_thw (images, 3)``, in prompt order)
    stand as runs of ``image_token_id``, one token per merged patch.

    NOTE: two images side by side (no token between them) are told apart by their token
    counts; transformers' run grouping cannot (real prompts wrap each image in vision start and
    end tokens). Raises ``ValueError`` when the image tokens and the images do not match."""
    ids = torch.as_tensor(input_ids, dtype=torch.int64)
    grids = [] if grid_thw is None else grid_thw.tolist()
    num_tokens = int(ids.numel())
    positions = torch.empty(3, num_tokens, dtype=torch.int64)
    is_image = ids == image_token_id
    run_starts = [0, *(torch.nonzero(is_image[1:] != is_image[:-1]).flatten() + 1).tolist()]
    run_ends = [*run_starts[1:], num_tokens]
    next_position, image = 0, 0
    for start, end in zip(run_starts, run_ends, strict=True):
        if start == end:
            continue
        if not bool(is_image[start]):
            positions[:, start:end] = torch.arange(end - start) + next_position
            next_position += end - start
            continue
        while start < end:
            if image == len(grids):
                raise ValueError(f"the prompt has more image tokens than its {len(grids)} images")
            frames, rows, cols = (grids[image][0], *(n // merge_size for n in grids[image][1:]))
            count = frames * rows * cols
            if start + count > end:
                raise ValueError(f"image {image} takes {count} tokens, its run has {end - start}")
            grid = torch.meshgrid(
                torch.arange(frames), torch.arange(rows), torch.arange(cols), indexing="ij"
            )
            positions[:, start : start + count] = torch.stack(grid).flatten(1) + next_position
            next_position += max(rows, cols)
            start += count
            image += 1
    if image != len(grids):
        raise ValueError(f"the prompt has image tokens for {image} of its {len(grids)} images")
    delta = int(positions.max()) + 1 - num_tokens if num_tokens else 0
    return PromptPositions(positions=positions, delta=delta)
