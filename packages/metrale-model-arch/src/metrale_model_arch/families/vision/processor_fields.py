"""Reads of ``preprocessor_config.json`` fields every image processor here shares."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_model_arch.families.vision.mmproj_preprocessor import mmproj_preprocessor_config

if TYPE_CHECKING:
    from metrale_model_arch.load import LoadedModel

PREPROCESSOR_CONFIG = "preprocessor_config.json"
# OpenAI CLIP's, transformers' defaults for these processors.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PIL_BICUBIC = 3
_STEPS = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")


def checkpoint_directory(loaded: LoadedModel) -> Path | None:
    """Where a loaded model's processor files are: its directory, a GGUF's mmproj file (whose
    header holds them), or ``None`` (a GGUF without one)."""
    return loaded.source.path if loaded.source.kind == "dir" else loaded.source.mmproj


def read_preprocessor_config(directory: Path | None) -> dict[str, object]:
    """``directory/preprocessor_config.json``; an mmproj GGUF's fields when ``directory`` is
    that file; empty (the defaults) without a directory (a GGUF) or the file."""
    if directory is not None and directory.is_file():
        return mmproj_preprocessor_config(directory)
    path = None if directory is None else directory / PREPROCESSOR_CONFIG
    if path is None or not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def check_steps(data: Mapping[str, object]) -> None:
    """Raises ``ValueError`` for a preprocessing step turned off (each is always taken)."""
    for step in _STEPS:
        if data.get(step, True) is not True:
            raise ValueError(f"{PREPROCESSOR_CONFIG}: {step} false is not supported")


def integer_field(data: Mapping[str, object], name: str, default: int, *, minimum: int = 1) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{PREPROCESSOR_CONFIG}: {name} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def numbers_field(
    data: Mapping[str, object], name: str, default: tuple[float, ...]
) -> tuple[float, ...]:
    """A number or a list of numbers, as a tuple."""
    value = data.get(name, default)
    values = list(value) if isinstance(value, list | tuple) else [value]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not values or len(numbers) != len(values):
        raise ValueError(f"{PREPROCESSOR_CONFIG}: {name} must be numbers, got {value!r}")
    return tuple(float(v) for v in numbers)
