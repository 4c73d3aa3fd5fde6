"""``ImageLimits``: what the server takes of one image (``met serve``'s image flags)."""

from __future__ import annotations

import attrs

DEFAULT_MAX_IMAGE_BYTES = 20 * 2**20  # OpenAI's per-image limit
DEFAULT_MAX_IMAGE_PIXELS = 7680 * 4320  # 8K
DEFAULT_FETCH_TIMEOUT_S = 10.0


@attrs.frozen(kw_only=True)
class ImageLimits:
    """Bytes and pixels of one image at most; whether http(s) image URLs are fetched, and
    within how many seconds."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    allow_urls: bool = False
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
