"""With no flags the engine serves the model it was given: a float32 or bf16 safetensors
checkpoint gives transformers' greedy tokens (never silently requantized), and a GLM-5.3 whose
indexer pools do not divide 16 gets a block size that holds them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from metrale_model_arch import Quantization, Tokenizer
from metrale_server import LLM, SamplingParams

from ..conftest import save_tiny_glm5

PROMPTS = [
    [1, 504, 3027, 314, 2386, 29],
    [1, 46, 112, 9, 2880],
    [1, 7, 7, 7, 7, 7, 7, 7, 7],
    [1, 30234, 12, 905, 17000, 2],
]
NEW_TOKENS = 32


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def saved_qwen3(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    default_tokenizer: Tokenizer,
) -> Path:
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp(f"tiny-qwen3-{request.param}")
    config = transformers.Qwen3Config(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).to(getattr(torch, request.param))
    model.save_pretrained(path, safe_serialization=True)
    default_tokenizer.save(path)
    return path


def transformers_greedy(path: Path, dtype: torch.dtype) -> list[list[int]]:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    outputs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def test_a_float_checkpoint_with_no_flags_gives_transformers_greedy_tokens(
    saved_qwen3: Path,
) -> None:
    llm = LLM(str(saved_qwen3))
    loaded = llm.engine.loaded
    assert loaded.quantization == Quantization.NONE, "auto must keep the checkpoint's weights"
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    got = [
        list(output.outputs[0].token_ids)
        for output in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    ]
    assert got == transformers_greedy(saved_qwen3, loaded.dtype)


@pytest.fixture(scope="module")
def glm5_pools_of_three(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> Path:
    path = tmp_path_factory.mktemp("glm5-kpool-3")
    return save_tiny_glm5(path, default_tokenizer, index_kpool=3, index_topk=9)


def test_glm5_with_pools_of_three_serves_paged_with_no_flags(glm5_pools_of_three: Path) -> None:
    llm = LLM(str(glm5_pools_of_three), max_batch_size=2)
    assert llm.engine.args.block_size == 18  # the least multiple of 3 not below 16
    assert llm.engine.plan.inputs.indexer_paged
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    [output] = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)
    assert len(output.outputs[0].token_ids) == 8


def test_glm5_with_a_block_size_that_splits_pools_is_refused(glm5_pools_of_three: Path) -> None:
    with pytest.raises(ValueError, match="--block-size 16 is not a multiple of index_kpool"):
        LLM(str(glm5_pools_of_three), block_size=16)
