"""The fixtures every metrale test tree shares (registered as the ``metrale`` pytest11 plugin).

Only lazily heavy: the fixtures import torch, transformers and the metrale packages when a test
asks for them, so loading the plugin costs nothing in a tree that needs none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from metrale_testing.checkpoints import save_tiny_llama

if TYPE_CHECKING:
    from metrale_model_arch import Tokenizer

# The context length of ``tiny_model_dir``.
TINY_MODEL_POSITIONS = 512


@pytest.fixture(scope="session")
def default_tokenizer() -> Tokenizer:
    """The bundled default model's (SmolLM2's) tokenizer, read from its GGUF header."""
    from metrale_config import read_gguf_header
    from metrale_model_arch import Tokenizer, resolve_model

    return Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)


@pytest.fixture(scope="session")
def tiny_model_factory(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Callable[[int], Path]:
    """``tiny_model_factory(max_positions)``: saves (once per context length) a 2-layer random
    Llama over SmolLM2's vocabulary, with that tokenizer and no chat template (so ChatML
    applies)."""
    saved: dict[int, Path] = {}

    def tiny_model_dir(max_positions: int) -> Path:
        if max_positions not in saved:
            path = tmp_path_factory.mktemp(f"tiny-llama-{max_positions}")
            save_tiny_llama(path, default_tokenizer, max_positions)
            default_tokenizer.save(path)
            saved[max_positions] = path
        return saved[max_positions]

    return tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory: Callable[[int], Path]) -> Path:
    """A 2-layer random Llama (GQA, untied) over SmolLM2's 49,152-token vocabulary, 512
    positions."""
    return tiny_model_factory(TINY_MODEL_POSITIONS)
