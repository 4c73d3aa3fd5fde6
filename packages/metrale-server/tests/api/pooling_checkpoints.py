"""Tiny random Qwen3 checkpoints for the pooling routes: an embedding model as transformers'
``Qwen3Model`` saves it (no ``model.`` prefix, no head) with sentence-transformers' files, and a
causal LM to serve as a yes/no reranker; both over SmolLM2's vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metrale_testing import save_random_model

from metrale_model_arch import Tokenizer

EMBED_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"},
]  # fmt: skip
LAST_TOKEN_POOLING = {
    "word_embedding_dimension": 64,
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": False,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
    "pooling_mode_weightedmean_tokens": False,
    "pooling_mode_lasttoken": True,
    "include_prompt": True,
}


def save_random_qwen3(
    path: Path, tokenizer: Tokenizer, model_class: str, **config_fields: Any
) -> Path:
    """A 2-layer Qwen3 of ``model_class`` with random weights (norms near 1), saved with the
    tokenizer; ``config_fields`` go into its config (and so into config.json)."""
    return save_random_model(
        path, tokenizer, "Qwen3Config", model_class, intermediate_size=96, **config_fields
    )


def save_tiny_embedding_model(path: Path, tokenizer: Tokenizer) -> Path:
    """Qwen3-Embedding's layout: the base model, tied, last-token pooling then normalization
    (sentence-transformers' files), Matryoshka (``is_matryoshka`` in config.json)."""
    save_random_qwen3(path, tokenizer, "Qwen3Model", tie_word_embeddings=True, is_matryoshka=True)
    (path / "modules.json").write_text(json.dumps(EMBED_MODULES))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(LAST_TOKEN_POOLING))
    return path


def save_tiny_reranker(path: Path, tokenizer: Tokenizer) -> Path:
    """A causal LM (untied), served with ``--task score`` as Qwen3-Reranker is."""
    return save_random_qwen3(path, tokenizer, "Qwen3ForCausalLM", tie_word_embeddings=False)
