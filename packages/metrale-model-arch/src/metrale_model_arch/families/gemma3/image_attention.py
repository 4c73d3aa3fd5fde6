"""Gemma 3's attention over a prompt with images: causal, except that an image's tokens all see
each other.

transformers builds Gemma 3's prefill mask from ``token_type_ids`` (1 on image tokens): a query
sees what causal attention shows it and every key of its own image, later ones too; a sliding
layer then keeps only keys less than ``window`` positions back (``AND(window, OR(causal, same
image))``). Here an image is a run of ``image_token_id`` among one sequence's rows of a step of
more than one row; :func:`with_image_spans` finds them and :func:`image_prompt_attention`
attends every row of such a step in torch ops (any device). Steps without one, decode steps
among them, keep the backend's paged attention: a single new token sees exactly what causal
attention shows it, as in transformers' decode (which passes no ``token_type_ids``).

NOTE: an image's tokens must be prefilled in one step (a chunk boundary inside the run would
hide its later tokens from its earlier ones): a run that starts a step's rows of a sequence with
earlier context, or ends them, is refused (Gemma 3's prompts close each image with
``<end_of_image>``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from metrale_kernels import AttentionMetadata
from metrale_kernels.reference.kv_quantization import gather_blocks

Span = tuple[int, int]  # (start, stop) positions of one image's tokens in its sequence


@attrs.frozen(kw_only=True, eq=False)
class ImagePromptMetadata(AttentionMetadata):
    """A step's metadata and ``image_spans[i]``: the images among sequence ``i``'s rows."""

    image_spans: tuple[tuple[Span, ...], ...]


def with_image_spans(
    metadata: AttentionMetadata, input_ids: torch.Tensor, image_token_id: int
) -> AttentionMetadata:
    """``metadata`` as an :class:`ImagePromptMetadata` when a sequence of several rows holds
    image tokens, else unchanged. Raises ``ValueError`` for an image cut by the step's edge."""
    if metadata.is_decode_only:
        return metadata
    is_image = input_ids == image_token_id
    if not bool(is_image.any()):
        return metadata
    flags = is_image.tolist()
    spans: list[tuple[Span, ...]] = []
    row = 0
    for seq, (query_len, seq_len) in enumerate(
        zip(metadata.query_lens, metadata.seq_lens, strict=True)
    ):
        rows = flags[row : row + query_len]
        row += query_len
        spans.append(_runs(rows, seq_len - query_len, seq) if query_len > 1 else ())
    if not any(spans):
        return metadata
    return _with_spans(metadata, tuple(spans))


def _with_spans(
    metadata: AttentionMetadata, spans: tuple[tuple[Span, ...], ...]
) -> ImagePromptMetadata:
    """``metadata`` and its window views (sliding-window rings), each with ``spans``."""
    fields = {f.name: getattr(metadata, f.name) for f in attrs.fields(AttentionMetadata) if f.init}
    fields["window_views"] = {
        window: _with_spans(view, spans) for window, view in metadata.window_views.items()
    }
    return ImagePromptMetadata(**fields, image_spans=spans)


def _runs(is_image: Sequence[bool], first_position: int, seq: int) -> tuple[Span, ...]:
    runs: list[Span] = []
    start: int | None = None
    for index, flag in enumerate([*is_image, False]):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            runs.append((first_position + start, first_position + index))
            start = None
    if runs and runs[0][0] == first_position and first_position > 0:
        raise ValueError(
            f"sequence {seq}: this step's rows start inside an image (position "
            f"{first_position}); an image's tokens must be prefilled in one step"
        )
    if runs and runs[-1][1] == first_position + len(is_image):
        raise ValueError(
            f"sequence {seq}: this step's rows end inside an image (position {runs[-1][1] - 1}); "
            "an image's tokens must be prefilled in one step, its <end_of_image> with them"
        )
    return tuple(runs)


def _visibility(metadata: AttentionMetadata, window: int | None) -> tuple[torch.Tensor, ...]:
    """Per sequence ``(query_len, seq_len)`` bool: the keys each of its rows sees."""
    assert isinstance(metadata, ImagePromptMetadata)
    device = metadata.block_tables.device
    masks = []
    for spans, query_len, seq_len in zip(
        metadata.image_spans, metadata.query_lens, metadata.seq_lens, strict=True
    ):
        query = torch.arange(seq_len - query_len, seq_len)[:, None]
        key = torch.arange(seq_len)[None, :]
        image = torch.full((seq_len,), -1)
        for index, (start, stop) in enumerate(spans):
            image[start:stop] = index
        visible = (key <= query) | ((image[query] == image[key]) & (image[query] >= 0))
        if window is not None:
            visible &= key > query - window
        masks.append(visible.to(device))
    return tuple(masks)


def image_prompt_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: ImagePromptMetadata,
    scale: float,
    sliding_window: int | None,
    *,
    softcap: float | None = None,
) -> torch.Tensor:
    """``q (tokens, heads, dim)`` over the paged caches, the step's K/V already written; the
    softmax runs in float32, as transformers' eager attention's does."""
    group = q.shape[1] // k_cache.shape[2]
    masks = metadata.derived(
        ("gemma3_image_visibility", sliding_window), _visibility, sliding_window
    )
    out = torch.empty_like(q)
    row = 0
    for seq, visible in enumerate(masks):
        query_len, seq_len = visible.shape
        num_blocks = -(-seq_len // metadata.block_size)
        blocks = metadata.block_tables[seq, :num_blocks]
        # (heads, keys, dim): query head h reads kv head h // group.
        keys, values = (
            gather_blocks(cache, blocks)
            .flatten(0, 1)[:seq_len]
            .to(q.dtype)
            .transpose(0, 1)
            .repeat_interleave(group, 0)
            for cache in (k_cache, v_cache)
        )
        query = q[row : row + query_len].transpose(0, 1)
        scores = torch.bmm(query, keys.transpose(1, 2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[row : row + query_len] = torch.bmm(probs, values).transpose(0, 1)
        row += query_len
    return out
