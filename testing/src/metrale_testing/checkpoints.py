"""Tiny random checkpoints as transformers saves them (safetensors), over a given tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metrale_model_arch import Tokenizer


def save_tiny_llama(path: Path, tokenizer: Tokenizer, max_positions: int) -> Path:
    """A 2-layer random Llama (GQA, untied) over ``tokenizer``'s vocabulary, saved as
    safetensors (the tokenizer is not saved: callers add the one they want)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def save_random_model(
    path: Path, tokenizer: Tokenizer, config_name: str, model_name: str, **extra: object
) -> Path:
    """A 2-layer model of transformers' ``model_name`` (its config ``config_name``, with
    ``extra`` fields) with random weights, norms near 1, saved with ``tokenizer``."""
    import torch
    import transformers

    config = getattr(transformers, config_name)(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **{"head_dim": 16, "max_position_embeddings": 256, **extra},
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
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
