"""An mmproj GGUF's preprocessing, as the ``preprocessor_config.json`` fields it stands for.

The mmproj holds the image size (Gemma 3's square), the patch size, the merge size
(Qwen2.5-VL's, else clip.cpp's 2) and the normalization's mean and std. It has no pixel bounds
for Qwen2.5-VL: clip.cpp's are taken (``set_limit_image_tokens(8, 4096)``: between 8 and 4096
merged patches an image), not the checkpoint processor's. Resampling stays the processor's
(clip.cpp resizes with its own filters, so pixels are not llama.cpp's bit for bit).
"""

from __future__ import annotations

from pathlib import Path

from metrale_config import read_gguf_header

# clip.cpp's bounds on a Qwen2.5-VL image, in merged patches.
QWEN2_5_VL_MIN_IMAGE_TOKENS = 8
QWEN2_5_VL_MAX_IMAGE_TOKENS = 4096
QWEN2_5_VL_DEFAULT_MERGE_SIZE = 2
QWEN2_5_VL_TEMPORAL_PATCH_SIZE = 2


def mmproj_preprocessor_config(path: Path) -> dict[str, object]:
    """The preprocessing fields of the mmproj GGUF at ``path`` (see the module docstring);
    ``ValueError`` naming the file for a projector with none known here."""
    header = read_gguf_header(path)
    fields = header.fields
    stats = {
        name: fields[f"clip.vision.{name}"]
        for name in ("image_mean", "image_std")
        if f"clip.vision.{name}" in fields
    }
    projector = fields.get("clip.projector_type")
    patch_size = fields.get("clip.vision.patch_size")
    if projector == "gemma3":
        size = fields.get("clip.vision.image_size")
        return {**stats, "size": {"height": size, "width": size}}
    if projector == "qwen2.5vl_merger" and isinstance(patch_size, int):
        merge_size = fields.get("clip.vision.spatial_merge_size", QWEN2_5_VL_DEFAULT_MERGE_SIZE)
        if not isinstance(merge_size, int) or merge_size < 1:
            raise ValueError(
                f"{header.source}: field 'clip.vision.spatial_merge_size' must be a positive "
                f"integer, got {merge_size!r}"
            )
        merged_patch_pixels = (patch_size * merge_size) ** 2
        return {
            **stats,
            "patch_size": patch_size,
            "merge_size": merge_size,
            "temporal_patch_size": QWEN2_5_VL_TEMPORAL_PATCH_SIZE,
            "min_pixels": QWEN2_5_VL_MIN_IMAGE_TOKENS * merged_patch_pixels,
            "max_pixels": QWEN2_5_VL_MAX_IMAGE_TOKENS * merged_patch_pixels,
        }
    raise ValueError(
        f"{header.source}: clip.projector_type {projector!r} has no preprocessing here"
    )
