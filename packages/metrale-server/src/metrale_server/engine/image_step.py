"""The encoder step: a scheduler step's image embeddings, put where its image tokens stand.

Before the forward of a step whose chunks reach image tokens, every image they reach is looked
up in the :class:`~metrale_server.engine.encoder_cache.EncoderCache`; the others are encoded,
batched up to ``batch_tokens`` image tokens a tower forward (an image larger than that alone),
and kept. The step's input embeddings are the text embeddings of its tokens with each reached
image token's row replaced by its image's embedding; a chunk that stops inside an image takes
the rows it reaches, and the next chunk finds the image in the cache (or encodes it again if
it was dropped meanwhile: the output is the same).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import torch

from metrale_model_arch import ImageEncoder, PreparedImage, PromptPositions
from metrale_server.engine.encoder_cache import EncoderCache
from metrale_server.engine.prompt_image import PromptImage, check_placed
from metrale_server.engine.scheduler_step import SchedulerStep


@attrs.frozen
class _Reach:
    """Rows ``flat_start ..`` of the step take ``placed``'s rows ``first .. last``."""

    placed: PromptImage
    flat_start: int
    first: int
    last: int


@attrs.define
class EncoderCounters:
    """Images encoded, and images found in the cache, since the engine started."""

    num_encoded: int = 0
    num_cache_hits: int = 0


class ImageStep:
    def __init__(
        self, encoder: ImageEncoder, cache: EncoderCache | None, *, batch_tokens: int
    ) -> None:
        self.encoder = encoder
        self.cache = cache
        self.batch_tokens = batch_tokens
        self.counters = EncoderCounters()

    def check(
        self,
        prompt: Sequence[int],
        images: Sequence[PromptImage],
        *,
        images_per_prompt: int,
        max_batch_tokens: int,
    ) -> None:
        """``ValueError`` unless ``images`` stand exactly on ``prompt``'s image tokens, number
        at most ``images_per_prompt``, and (a model prefilling each image within one step) each
        fits the ``max_batch_tokens`` one sequence may run in a step with its begin and end
        markers."""
        if len(images) > images_per_prompt:
            raise ValueError(
                f"the request has {len(images)} images; this server takes at most "
                f"{images_per_prompt} (met serve --limit-mm-per-prompt)"
            )
        check_placed(prompt, self.encoder.image_token_id, images)
        largest = max((placed.image.num_tokens + 2 for placed in images), default=0)
        if self.encoder.whole_images and largest > max_batch_tokens:
            raise ValueError(
                f"an image takes {largest} tokens with its markers, which this model prefills in "
                f"one step: more than the {max_batch_tokens} one sequence runs in a step (met "
                "serve --max-prefill-tokens; or --sliding-window-cache full where a ring caps "
                "the step)"
            )

    def rope_positions(
        self, prompt: Sequence[int], images: Sequence[PromptImage]
    ) -> PromptPositions | None:
        """The prompt's M-RoPE positions, or ``None`` where they are its token indices."""
        return self.encoder.rope_positions(prompt, [placed.image for placed in images])

    def input_embeds(self, step: SchedulerStep, input_ids: torch.Tensor) -> torch.Tensor | None:
        """``(tokens, hidden)`` for the step's ``input_ids``, or ``None`` when it reaches no
        image token (the model embeds its tokens itself)."""
        reaches = list(_reaches(step))
        if not reaches:
            return None
        images = self._embeddings({r.placed.digest: r.placed.image for r in reaches})
        embeds = self.encoder.embed_tokens(input_ids)
        for reach in reaches:
            rows = images[reach.placed.digest][reach.first : reach.last]
            embeds[reach.flat_start : reach.flat_start + len(rows)] = rows
        return embeds

    def _embeddings(self, needed: dict[str, PreparedImage]) -> dict[str, torch.Tensor]:
        found: dict[str, torch.Tensor] = {}
        missing: list[PreparedImage] = []
        for digest, image in needed.items():
            cached = None if self.cache is None else self.cache.get(digest)
            if cached is None:
                missing.append(image)
            else:
                found[digest] = cached
                self.counters.num_cache_hits += 1
        for batch in _batches(missing, self.batch_tokens):
            for image, embeddings in zip(batch, self.encoder.encode(batch), strict=True):
                found[image.digest] = embeddings
                if self.cache is not None:
                    self.cache.put(image.digest, embeddings)
            self.counters.num_encoded += len(batch)
        return found


def _reaches(step: SchedulerStep) -> Iterator[_Reach]:
    flat = 0
    for chunk in step.chunks:
        start, end = chunk.start, chunk.start + chunk.num_new_tokens
        for placed in chunk.seq.images:
            first, last = max(start, placed.offset), min(end, placed.end)
            if first < last:
                yield _Reach(
                    placed=placed,
                    flat_start=flat + first - start,
                    first=first - placed.offset,
                    last=last - placed.offset,
                )
        flat += chunk.num_new_tokens


def _batches(images: list[PreparedImage], batch_tokens: int) -> Iterator[list[PreparedImage]]:
    batch: list[PreparedImage] = []
    tokens = 0
    for image in images:
        if batch and tokens + image.num_tokens > batch_tokens:
            yield batch
            batch, tokens = [], 0
        batch.append(image)
        tokens += image.num_tokens
    if batch:
        yield batch
