"""``PreparedImage`` and ``ImageEncoder``: what a serving engine needs of a model that takes
images.

The API prepares each image on its own threads (:meth:`ImageEncoder.prepare`: decode, resize,
normalize, patchify), the engine encodes the images a step needs in one batch
(:meth:`ImageEncoder.encode`) and puts each image's embeddings where its image tokens stand in
the prompt (:meth:`ImageEncoder.embed_tokens` gives the text embeddings they replace). A model
whose rotary positions follow the images (M-RoPE) gives a prompt's positions once, when the
request is made (:meth:`ImageEncoder.rope_positions`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
import torch

if TYPE_CHECKING:
    from PIL import Image

    from metrale_model_arch.prompt_positions import PromptPositions


@attrs.frozen(kw_only=True, eq=False)
class PreparedImage:
    """One image as the tower takes it: ``pixel_values (patches, patch_dim)`` float32 and its
    ``grid`` (frames, rows, columns of patches); it takes ``num_tokens`` image tokens in the
    prompt. ``digest`` names its pixels (derived from them and the grid): equal digests encode
    to equal embeddings."""

    pixel_values: torch.Tensor = attrs.field(repr=False)
    grid: tuple[int, int, int]
    num_tokens: int
    digest: str = attrs.field()

    @digest.default
    def _digest(self) -> str:
        hasher = hashlib.blake2b(digest_size=16)
        hasher.update(repr(self.grid).encode())
        hasher.update(self.pixel_values.contiguous().numpy().tobytes())
        return hasher.hexdigest()


class ImageEncoder(Protocol):
    """A model's image path (see the module docstring).

    How images stand in a prompt: the chat template writes one ``image_token_id`` per image,
    which the engine repeats for each of its tokens; or, where ``text_expansion`` is set (Gemma
    3), the processor's text for an image replaces each ``placeholder_text`` the template wrote,
    before tokenizing. ``whole_images``: an image's tokens attend to each other, so each image
    is prefilled within one step.
    """

    placeholder_text: str | None
    text_expansion: str | None
    whole_images: bool

    @property
    def image_token_id(self) -> int:
        """The prompt token each of an image's embeddings replaces."""
        ...

    @property
    def hidden_size(self) -> int:
        """Width of one image embedding (the text stack's hidden size)."""
        ...

    @property
    def max_tokens_per_image(self) -> int:
        """The most image tokens one image can take after preprocessing."""
        ...

    def prepare(self, image: Image.Image) -> PreparedImage:
        """Thread-safe and model-free: what preprocessing makes of a decoded image.
        ``ValueError`` for an image the preprocessing cannot take (its message says why)."""
        ...

    def encode(self, images: Sequence[PreparedImage]) -> list[torch.Tensor]:
        """``(num_tokens, hidden_size)`` embeddings per image, in the model's dtype, one
        forward of the tower for all of them."""
        ...

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The text stack's input embeddings of ``input_ids`` (what the model's ``forward``
        takes as ``inputs_embeds``)."""
        ...

    def rope_positions(
        self, token_ids: Sequence[int], images: Sequence[PreparedImage]
    ) -> PromptPositions | None:
        """The prompt's positions when they are not its token indices (``images`` stand, in
        order, on ``token_ids``' runs of image tokens); ``None`` when they are. Thread-safe
        and model-free."""
        ...
