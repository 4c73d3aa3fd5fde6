"""Images in requests: OpenAI ``image_url`` parts, read, fetched, decoded and prepared.

A part's ``url`` is a ``data:`` URL (base64), or an ``http(s)`` URL the server fetches only when
started with ``--allow-image-urls`` (within ``fetch_timeout_s`` and ``max_bytes``). Each image
is refused with a 400 naming its part when its bytes exceed ``max_bytes``, Pillow cannot read
them, its pixels exceed ``max_pixels`` (checked from the header, before any pixel is
decoded), or the model's preprocessing cannot take it (beyond 200:1 for Qwen2-VL's); a
request with more images than the engine takes is refused before any is read. Anthropic's
``image`` blocks arrive here as the same parts (:mod:`~metrale_server.api.anthropic_content`).
"""

from __future__ import annotations

import base64
import binascii
import io
import time
from collections.abc import Sequence

import attrs
import httpx
from PIL import Image, ImageOps, UnidentifiedImageError

from metrale_model_arch import ImageEncoder, PreparedImage
from metrale_server.api.errors import bad_request
from metrale_server.api.fields import Fields
from metrale_server.image_limits import ImageLimits


@attrs.frozen(kw_only=True)
class ImageSource:
    """One image part: its ``url`` (a data URL or http(s)) and the ``param`` naming it."""

    url: str = attrs.field(repr=False)
    param: str


def read_image_url_part(part: Fields) -> ImageSource:
    """An OpenAI ``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}`` part
    (``image_url`` may also be the URL itself, as some clients send it)."""
    part.read_optional_str("type")
    value = part.raw("image_url")
    if isinstance(value, str):
        url = value
    else:
        image_url = part.read_object("image_url")
        detail = image_url.read_optional_str("detail")
        if detail not in (None, "auto", "low", "high"):
            image_url.fail("detail", f'must be "auto", "low" or "high", got {detail!r}')
        read = image_url.read_optional_str("url")
        image_url.refuse_unread()
        if read is None:
            image_url.fail("url", "is required")
        url = read
    part.refuse_unread()
    if not url.startswith(("data:", "http://", "https://")):
        part.fail("image_url", "must be a data: URL (base64) or an http(s) URL")
    return ImageSource(url=url, param=part.param("image_url"))


def prepare_images(
    sources: Sequence[ImageSource],
    encoder: ImageEncoder,
    limits: ImageLimits,
    *,
    max_images: int,
) -> list[PreparedImage]:
    """Each source decoded and prepared as the model takes it, in order."""
    if len(sources) > max_images:
        raise bad_request(
            f"the request has {len(sources)} images; this server takes at most {max_images} "
            "(met serve --limit-mm-per-prompt)",
            param=sources[max_images].param,
        )
    return [prepare_image(source, encoder, limits) for source in sources]


def prepare_image(source: ImageSource, encoder: ImageEncoder, limits: ImageLimits) -> PreparedImage:
    image = load_image(source, limits)
    try:
        return encoder.prepare(image)
    except ValueError as error:
        raise bad_request(f"the image cannot be prepared: {error}", param=source.param) from error


def load_image(source: ImageSource, limits: ImageLimits) -> Image.Image:
    data = _image_bytes(source, limits)
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > limits.max_pixels:
            raise bad_request(
                f"the image is {width}x{height} pixels, over the limit of {limits.max_pixels} "
                "(met serve --max-image-pixels)",
                param=source.param,
            )
        image.load()
        return ImageOps.exif_transpose(image)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise bad_request(f"the image cannot be read: {error}", param=source.param) from error


def _image_bytes(source: ImageSource, limits: ImageLimits) -> bytes:
    url = source.url
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise bad_request(
                "a data URL must be data:<media type>;base64,<data>", param=source.param
            )
        # base64 is 4 characters for 3 bytes: refuse what must decode past the limit unread.
        if len(payload) // 4 * 3 > limits.max_bytes + 3:
            raise _too_large(source, limits)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as error:
            message = f"the data URL is not valid base64: {error}"
            raise bad_request(message, param=source.param) from error
        if len(data) > limits.max_bytes:
            raise _too_large(source, limits)
        return data
    if not limits.allow_urls:
        raise bad_request(
            "image URLs are not fetched by this server (met serve --allow-image-urls); send the "
            "image as a data URL",
            param=source.param,
        )
    return _fetch(source, limits)


def _fetch(source: ImageSource, limits: ImageLimits) -> bytes:
    try:
        with (
            httpx.Client(timeout=limits.fetch_timeout_s, follow_redirects=True) as client,
            client.stream("GET", source.url) as response,
        ):
            if response.status_code != 200:
                raise bad_request(
                    f"fetching the image answered HTTP {response.status_code}",
                    param=source.param,
                )
            chunks, size = [], 0
            deadline = time.monotonic() + limits.fetch_timeout_s
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limits.max_bytes:
                    raise _too_large(source, limits)
                if time.monotonic() > deadline:
                    raise bad_request(
                        f"fetching the image took over {limits.fetch_timeout_s:g} s",
                        param=source.param,
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except httpx.HTTPError as error:
        raise bad_request(f"fetching the image failed: {error}", param=source.param) from error


def _too_large(source: ImageSource, limits: ImageLimits) -> Exception:
    return bad_request(
        f"the image is larger than {limits.max_bytes} bytes (met serve --max-image-bytes)",
        param=source.param,
    )
