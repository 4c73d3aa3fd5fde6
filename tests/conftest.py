"""Fixtures shared by the cross-package tests: the default tokenizer and tiny random Llamas."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model


@pytest.fixture(scope="session")
def default_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)


@pytest.fixture(scope="session")
def tiny_model_factory(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Callable[[int], Path]:
    """Saves (once per context length) a 2-layer random Llama over SmolLM2's vocabulary, with
    that tokenizer and no chat template (so ChatML applies)."""
    saved: dict[int, Path] = {}

    def tiny_model_dir(max_positions: int) -> Path:
        if max_positions in saved:
            return saved[max_positions]
        import torch
        import transformers

        path = tmp_path_factory.mktemp(f"tiny-llama-{max_positions}")
        config = transformers.LlamaConfig(
            vocab_size=default_tokenizer.vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            initializer_range=0.2,
            bos_token_id=default_tokenizer.bos_token_id,
            eos_token_id=default_tokenizer.eos_token_id,
        )
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
        default_tokenizer.save(path)
        saved[max_positions] = path
        return path

    return tiny_model_dir
