"""``PromptImage``: an image placed in a prompt, and the placing of a request's images."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from metrale_model_arch import ImageEncoder, PreparedImage


@attrs.frozen(kw_only=True, eq=False)
class PromptImage:
    """``image``'s embeddings stand for prompt tokens ``offset .. end`` (its image tokens)."""

    offset: int
    image: PreparedImage

    @property
    def end(self) -> int:
        return self.offset + self.image.num_tokens

    @property
    def digest(self) -> str:
        return self.image.digest


def place_images(
    prompt: Sequence[int], image_token_id: int, images: Sequence[PreparedImage]
) -> tuple[tuple[int, ...], tuple[PromptImage, ...]]:
    """``prompt`` with its i-th ``image_token_id`` (the chat template's one placeholder per
    image) repeated for each of image i's tokens, and where each image now stands. Raises
    ``ValueError`` when placeholders and images differ in number."""
    tokens: list[int] = []
    placed: list[PromptImage] = []
    for token in prompt:
        if token != image_token_id:
            tokens.append(token)
            continue
        if len(placed) == len(images):
            raise ValueError(
                f"the prompt has more image placeholders than its {len(images)} image(s)"
            )
        image = images[len(placed)]
        placed.append(PromptImage(offset=len(tokens), image=image))
        tokens.extend([image_token_id] * image.num_tokens)
    if len(placed) != len(images):
        raise ValueError(
            f"the prompt has {len(placed)} image placeholder(s) for {len(images)} image(s)"
        )
    return tuple(tokens), tuple(placed)


def check_placed(
    prompt: Sequence[int], image_token_id: int | None, images: Sequence[PromptImage]
) -> None:
    """Raises ``ValueError`` unless ``images`` cover exactly the prompt's image tokens, in
    order and without overlap (what :func:`place_images` makes)."""
    covered = 0
    previous_end = 0
    for placed in images:
        if placed.offset < previous_end or placed.end > len(prompt):
            raise ValueError("images overlap or run past the prompt")
        if image_token_id is None or any(
            prompt[i] != image_token_id for i in range(placed.offset, placed.end)
        ):
            raise ValueError("an image does not stand on image tokens")
        covered += placed.image.num_tokens
        previous_end = placed.end
    if image_token_id is not None:
        count = sum(1 for token in prompt if token == image_token_id)
        if count != covered:
            raise ValueError(f"the prompt has {count} image tokens but its images take {covered}")


def locate_images(
    prompt: Sequence[int], image_token_id: int, images: Sequence[PreparedImage]
) -> tuple[PromptImage, ...]:
    """Where each image stands in a prompt whose text already held every image's tokens (a
    model whose processor expands images in the text, Gemma 3): image i on the i-th run of
    ``image_token_id``, which must be as long as its tokens. Raises ``ValueError`` otherwise."""
    placed: list[PromptImage] = []
    index = 0
    while index < len(prompt):
        if prompt[index] != image_token_id:
            index += 1
            continue
        end = index
        while end < len(prompt) and prompt[end] == image_token_id:
            end += 1
        if len(placed) == len(images):
            raise ValueError(f"the prompt has more image token runs than its {len(images)} images")
        image = images[len(placed)]
        if end - index != image.num_tokens:
            raise ValueError(
                f"image {len(placed)} takes {image.num_tokens} tokens; its run has {end - index}"
            )
        placed.append(PromptImage(offset=index, image=image))
        index = end
    if len(placed) != len(images):
        raise ValueError(
            f"the prompt has {len(placed)} image token run(s) for {len(images)} images"
        )
    return tuple(placed)


def images_in_prompt(
    encoder: ImageEncoder,
    tokenize: Callable[[str], Sequence[int]],
    text: str,
    images: Sequence[PreparedImage],
) -> tuple[tuple[int, ...], tuple[PromptImage, ...]]:
    """A prompt text holding one image placeholder per image (what the model's chat template
    writes) as token ids with each image's tokens in, and where each image stands: the
    placeholder token repeated for the image's tokens, or, for a model whose processor expands
    images in the text (``encoder.text_expansion``), each marker replaced before tokenizing.
    Raises ``ValueError`` when placeholders and images differ in number."""
    marker, expansion = encoder.placeholder_text, encoder.text_expansion
    if marker is None or expansion is None:
        return place_images(tokenize(text), encoder.image_token_id, images)
    count = text.count(marker)
    if count != len(images):
        raise ValueError(f"the prompt has {count} image marker(s) for {len(images)} image(s)")
    token_ids = tuple(tokenize(text.replace(marker, expansion)))
    return token_ids, locate_images(token_ids, encoder.image_token_id, images)
