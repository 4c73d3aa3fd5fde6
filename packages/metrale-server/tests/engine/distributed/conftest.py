"""Tiny random checkpoints for the tensor-parallel tests: a Qwen3 (q/k norms) and a Qwen3-MoE
(tied embeddings), over SmolLM2's vocabulary; the Llama is the package's ``tiny_model_dir``."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_model_arch import Tokenizer


def _save(
    path: Path, tokenizer: Tokenizer, config_name: str, model_name: str, **extra: object
) -> Path:
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


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return _save(
        tmp_path_factory.mktemp("tiny-qwen3"),
        default_tokenizer,
        "Qwen3Config",
        "Qwen3ForCausalLM",
        intermediate_size=96,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    return _save(
        tmp_path_factory.mktemp("tiny-qwen3-moe"),
        default_tokenizer,
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        tie_word_embeddings=True,
    )
