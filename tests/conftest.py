"""Fixtures of the cross-package tests: tiny random Llamas and MoE models (the default tokenizer
and ``tiny_model_factory`` come from the shared ``metrale_testing`` plugin)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import tokenizers
from metrale_testing import build_native_ops_first as pytest_sessionstart  # noqa: F401
from metrale_testing import save_random_model, save_tiny_llama, stay_eager
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from metrale_model_arch import Tokenizer

stay_eager()


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


# model_type -> (transformers config class, model class, config fields beyond those
# ``save_random_model`` sets)
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
            "head_dim": None,  # transformers derives it: 64 / 4
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
        if model_type not in saved:
            config_name, model_name, extra = TINY_MOE_FAMILIES[model_type]
            path = tmp_path_factory.mktemp(f"tiny-{model_type}")
            save_random_model(path, default_tokenizer, config_name, model_name, **extra)
            saved[model_type] = path
        return saved[model_type]

    return tiny_moe_dir
