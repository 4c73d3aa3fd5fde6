"""Images in prompts: placing them on their tokens, keying prefix-cache blocks by them, and the
encoder cache's pages."""

from __future__ import annotations

import pytest
import torch

from metrale_model_arch import PreparedImage, plain_allocator
from metrale_model_arch.memory import ENCODER_CACHE_PAGE_TOKENS
from metrale_server.engine.block_hash import BlockHash
from metrale_server.engine.encoder_cache import EncoderCache
from metrale_server.engine.prompt_image import PromptImage, check_placed, place_images
from metrale_server.engine.sequence import Sequence
from metrale_server.sampling.params import SamplingParams

IMAGE = 9


def image(num_tokens: int, seed: int) -> PreparedImage:
    pixels = torch.randn((4 * num_tokens, 3), generator=torch.Generator().manual_seed(seed))
    grid = (1, 2, 2 * num_tokens)
    return PreparedImage(pixel_values=pixels, grid=grid, num_tokens=num_tokens)


def test_each_placeholder_becomes_its_images_tokens() -> None:
    first, second = image(3, seed=0), image(2, seed=1)
    tokens, placed = place_images([1, IMAGE, 5, IMAGE, 6], IMAGE, [first, second])
    assert tokens == (1, IMAGE, IMAGE, IMAGE, 5, IMAGE, IMAGE, 6)
    assert [(p.offset, p.end) for p in placed] == [(1, 4), (5, 7)]
    check_placed(tokens, IMAGE, placed)
    with pytest.raises(ValueError, match="more image placeholders than its 1 image"):
        place_images([IMAGE, IMAGE], IMAGE, [first])
    with pytest.raises(ValueError, match=r"1 image placeholder.* for 2 image"):
        place_images([IMAGE], IMAGE, [first, second])


def test_images_off_their_tokens_are_refused() -> None:
    first = image(2, seed=0)
    with pytest.raises(ValueError, match="does not stand on image tokens"):
        check_placed((1, IMAGE, IMAGE), IMAGE, [PromptImage(offset=0, image=first)])
    with pytest.raises(ValueError, match="3 image tokens but its images take 2"):
        check_placed((IMAGE, IMAGE, IMAGE), IMAGE, [PromptImage(offset=0, image=first)])
    with pytest.raises(ValueError, match="run past the prompt"):
        check_placed((1, IMAGE), IMAGE, [PromptImage(offset=1, image=first)])


def test_equal_digests_are_equal_pixels() -> None:
    assert image(2, seed=0).digest == image(2, seed=0).digest
    assert image(2, seed=0).digest != image(2, seed=1).digest


def sequence(images: tuple[PromptImage, ...]) -> Sequence:
    return Sequence(
        seq_id=0,
        request_id="r",
        prompt_token_ids=(1, IMAGE, IMAGE, 2, 3, 4),
        params=SamplingParams(),
        arrival_time=0.0,
        images=images,
    )


def test_blocks_that_reach_an_image_are_keyed_by_it() -> None:
    one = sequence((PromptImage(offset=1, image=image(2, seed=0)),))
    other = sequence((PromptImage(offset=1, image=image(2, seed=1)),))
    assert one.token_ids == other.token_ids
    # Tokens 0..2 reach the image: their keys differ by its digest; tokens 3..5 do not.
    assert BlockHash(None, one.block_key(0, 3)) != BlockHash(None, other.block_key(0, 3))
    assert one.block_key(3, 6) == other.block_key(3, 6) == (2, 3, 4)
    assert sequence(()).block_key(0, 3) == (1, IMAGE, IMAGE)


def cache(tokens: int, hidden: int = 4) -> EncoderCache:
    return EncoderCache(
        cache_tokens=tokens,
        hidden_size=hidden,
        dtype=torch.float32,
        device=torch.device("cpu"),
        allocator=plain_allocator,
    )


def test_the_cache_gives_back_what_it_kept_and_drops_the_least_recent() -> None:
    pages = 3
    kept = cache(pages * ENCODER_CACHE_PAGE_TOKENS)
    a = torch.randn(ENCODER_CACHE_PAGE_TOKENS + 1, 4)  # two pages
    b = torch.randn(5, 4)  # one page
    assert kept.put("a", a)
    assert kept.put("b", b)
    assert kept.num_free_pages == 0
    assert torch.equal(kept.get("a"), a)  # "a" is now the most recent
    c = torch.randn(3, 4)
    assert kept.put("c", c)  # drops "b"
    assert "b" not in kept
    assert torch.equal(kept.get("a"), a)
    assert torch.equal(kept.get("c"), c)
    assert not kept.put("huge", torch.randn(pages * ENCODER_CACHE_PAGE_TOKENS + 1, 4))
    assert "a" in kept  # a refused image drops nothing
    assert "c" in kept
