"""Fixtures shared by the cross-package tests: the default tokenizer and tiny random Llamas."""

from __future__ import annotations

import os

# Engines built here (and servers started from here) stay eager: a test that wants the
# compiled layer steps asks for them with enforce_eager=False.
os.environ.setdefault("METRALE_ENFORCE_EAGER", "1")

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from metrale_config import read_gguf_header
from metrale_model_arch import Tokenizer, resolve_model


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the native CPU ops before any test, so every engine loads them at start (a build
    racing the first tests would swap kernels mid-run)."""
    del session
    from metrale_kernels.native import load_native_ops_if_possible

    load_native_ops_if_possible()  # else the reference ops serve; the cpu backend's tests say why


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
        if max_positions not in saved:
            path = tmp_path_factory.mktemp(f"tiny-llama-{max_positions}")
            save_tiny_llama(path, default_tokenizer, max_positions)
            default_tokenizer.save(path)
            saved[max_positions] = path
        return saved[max_positions]

    return tiny_model_dir


@pytest.fixture(scope="session")
def tiny_byte_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama over a 258-token vocabulary: ``<s>``, ``</s>`` and the 256
    byte-level BPE bytes, no merges (so every character is a token); 1024 positions."""
    path = tmp_path_factory.mktemp("tiny-byte-llama")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<s>": 0, "</s>": 1, **{byte: 2 + i for i, byte in enumerate(alphabet)}}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>")])
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 0)]
    )
    backend.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_dir(path)
    assert tokenizer.vocab_size == 258
    save_tiny_llama(path, tokenizer, 1024)
    return path


def save_tiny_llama(path: Path, tokenizer: Tokenizer, max_positions: int) -> None:
    """A 2-layer random Llama over ``tokenizer``'s vocabulary, saved as safetensors."""
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


# model_type -> (transformers config class, model class, config fields beyond the shared ones)
TINY_MOE_FAMILIES: dict[str, tuple[str, str, dict[str, object]]] = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "head_dim": 16,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
            "tie_word_embeddings": True,
        },
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {
            "intermediate_size": 48,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": None,
            "tie_word_embeddings": False,
        },
    ),
}


@pytest.fixture(scope="session")
def tiny_moe_factory(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Callable[[str], Path]:
    """Saves (once per model type in ``TINY_MOE_FAMILIES``) a 2-layer random MoE model over
    SmolLM2's vocabulary with that tokenizer; every parameter is random, norms included."""
    saved: dict[str, Path] = {}

    def tiny_moe_dir(model_type: str) -> Path:
        if model_type in saved:
            return saved[model_type]
        import torch
        import transformers

        config_name, model_name, extra = TINY_MOE_FAMILIES[model_type]
        path = tmp_path_factory.mktemp(f"tiny-{model_type}")
        config = getattr(transformers, config_name)(
            vocab_size=default_tokenizer.vocab_size,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            bos_token_id=default_tokenizer.bos_token_id,
            eos_token_id=default_tokenizer.eos_token_id,
            **extra,
        )
        model = getattr(transformers, model_name)(config)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in model.named_parameters():
                noise = torch.randn(param.shape, generator=generator)
                param.copy_(1.0 + 0.2 * noise if "norm" in name else 0.2 * noise)
        model.save_pretrained(path, safe_serialization=True)
        default_tokenizer.save(path)
        saved[model_type] = path
        return path

    return tiny_moe_dir
