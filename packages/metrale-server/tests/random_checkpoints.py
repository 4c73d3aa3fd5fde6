"""Tiny random checkpoints as transformers saves them, over the default tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_model_arch import Tokenizer


def save_random_model(
    path: Path, tokenizer: Tokenizer, config_name: str, model_name: str, **extra: object
) -> Path:
    """A 2-layer model of transformers' ``model_name`` (its config ``config_name``, with
    ``extra`` fields) with random weights, norms near 1, saved with ``tokenizer``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, config_name)(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )
    model = getattr(transformers, model_name)(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)
    return path
