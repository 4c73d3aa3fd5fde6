"""An embedding model saved without a head and untied (Qwen3-Embedding-8B's layout): planned
and loaded without one, its vectors equal transformers'; a generation task refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from metrale_model_arch import CheckpointError, Tokenizer
from metrale_model_arch.owners import LM_HEAD
from metrale_server import LLM, SamplingParams
from metrale_server.pooling import PoolingParams

from ..api.pooling_checkpoints import EMBED_MODULES, LAST_TOKEN_POOLING, save_random_qwen3

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def untied_embedding_dir(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    path = tmp_path_factory.mktemp("untied-embedding")
    save_random_qwen3(path, default_tokenizer, "Qwen3Model", tie_word_embeddings=False)
    (path / "modules.json").write_text(json.dumps(EMBED_MODULES))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(LAST_TOKEN_POOLING))
    return path


def test_planned_and_loaded_without_a_head(untied_embedding_dir: Path) -> None:
    llm = LLM(str(untied_embedding_dir), dtype="float32")  # task auto: sentence-transformers
    core = llm.engine.core
    assert core.task.name == "embed"
    assert core.loaded.config.tie_word_embeddings
    assert core.plan.allocated_by_owner().get(LM_HEAD, 0) == 0
    assert core.ledger.live_bytes_by_owner().get(LM_HEAD, 0) == 0
    prompt = [300, 301, 302, 303, 304]
    output = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(pooling=PoolingParams()))
    reference = transformers.Qwen3Model.from_pretrained(
        untied_embedding_dir, torch_dtype=torch.float32
    )
    with torch.no_grad():
        state = reference(torch.tensor([prompt])).last_hidden_state[0, -1]
    expected = torch.nn.functional.normalize(state, dim=0)
    assert output[0].pooled is not None
    assert torch.allclose(torch.tensor(output[0].pooled), expected, atol=1e-5)


def test_generation_refuses_a_model_without_its_head(untied_embedding_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="has no head to load"):
        LLM(str(untied_embedding_dir), dtype="float32", task="generate")
