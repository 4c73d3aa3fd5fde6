"""Shared fixtures: a tiny random Llama saved as a real checkpoint, with the default tokenizer."""

from __future__ import annotations

import os

# Engines built here (and servers started from here) stay eager: a test that wants the
# compiled layer steps asks for them with enforce_eager=False.
os.environ.setdefault("METRALE_ENFORCE_EAGER", "1")

from pathlib import Path

import pytest

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model


@pytest.fixture(scope="session")
def default_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf_fields(read_gguf_header(resolve_model(None).path).fields)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    """A 2-layer random Llama (GQA, untied) over SmolLM2's 49,152-token vocabulary."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(
        vocab_size=default_tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    default_tokenizer.save(path)
    return path
