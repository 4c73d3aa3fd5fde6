"""The engine on a tiny random ``kimi_linear`` checkpoint (a KDA layer, then a NoPE MLA layer
with a sparse MoE FFN): transformers' greedy tokens, batched; plan == ledger byte for byte with
the latent KV pool and the linear state pool; n-gram and draft-model speculation roll the KDA
state back and keep the greedy tokens."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from metrale_testing import randomize_weights
from metrale_testing.engine_parity import (
    assert_ledger_equals_plan,
    assert_speculation_keeps_greedy_with_rollbacks,
    greedy_from_ids,
)
from metrale_testing.greedy import repeated_phrase_prompts, transformers_greedy

from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import KV_POOL, LINEAR_STATE_POOL, ROPE_TABLE
from metrale_server import LLM
from metrale_server.speculative_config import SpeculativeConfig

transformers = pytest.importorskip("transformers")

MAX_SEQ_LEN = 64
NUM_TOKENS = 24
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "q_lora_rank": None,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "linear_num_heads": 2,
    "linear_head_dim": 16,
    "layer_types": ["linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "sparse"],
    "pad_token_id": None,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-kimi-linear")
    config = transformers.KimiLinearConfig(
        vocab_size=default_tokenizer.vocab_size,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        **TINY,
    )
    model = transformers.KimiLinearForCausalLM(config)
    randomize_weights(model, torch.Generator().manual_seed(0), buffers=True)
    model.save_pretrained(path, safe_serialization=True)
    default_tokenizer.save(path)
    return path


def kimi(path: Path, **args: object) -> LLM:
    return LLM(
        str(path), dtype="float32", device="cpu", max_seq_len=MAX_SEQ_LEN, max_batch_size=4,
        **args,
    )  # fmt: skip


def test_batched_greedy_equals_transformers(model_dir: Path) -> None:
    hf_model = transformers.KimiLinearForCausalLM.from_pretrained(model_dir).eval()
    batch = repeated_phrase_prompts(4, seed=5)
    expected = [transformers_greedy(hf_model, prompt, NUM_TOKENS) for prompt in batch]
    # Prefill chunks of at most 16 tokens: the 4 prompts never fit one step.
    llm = kimi(model_dir, max_batch_tokens=16)
    assert greedy_from_ids(llm, batch, NUM_TOKENS) == expected
    assert llm.engine.stats.num_partial_prefill_chunks > 0


def test_ledger_equals_plan_with_the_latent_and_linear_state_pools(model_dir: Path) -> None:
    # float32: every saved tensor at 4 bytes, by owner.
    engine = assert_ledger_equals_plan(
        model_dir, "float32", max_seq_len=MAX_SEQ_LEN, float32_names=".gate."
    )
    allocated = engine.plan.allocated_by_owner()
    # One MLA layer: 32 latent + 8 unrotated key values a token.
    assert engine.plan.kv_bytes_per_token == (32 + 8) * 4
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    # One KDA layer: a (2, 16, 16) recurrent state and 3 conv inputs of 3 * 2 * 16 channels, for
    # 2 sequences and the dummy slot.
    assert allocated[LINEAR_STATE_POOL] == 3 * (2 * 16 * 16 + 3 * 2 * 16 * 3) * 4
    assert allocated.get(ROPE_TABLE, 0) == 0


def test_ngram_speculation_rolls_the_state_back_and_keeps_greedy_tokens(model_dir: Path) -> None:
    # A random model seldom repeats itself: with these prompts n-gram lookup drafts, and the
    # drafts are rejected (the state rolled back).
    batch = repeated_phrase_prompts(6, seed=6)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    stats = assert_speculation_keeps_greedy_with_rollbacks(
        functools.partial(kimi, model_dir), batch, NUM_TOKENS, spec
    )
    assert stats.num_draft_tokens > 0, stats


def test_draft_model_speculation_rolls_the_state_back_and_keeps_greedy_tokens(
    model_dir: Path, tiny_model_dir: Path
) -> None:
    # The tiny random Llama (the same vocabulary) drafts: its drafts are mostly rejected, so
    # the KDA state is rolled back again and again.
    batch = repeated_phrase_prompts(4, seed=5)
    spec = SpeculativeConfig(
        method="draft_model", model=str(tiny_model_dir), num_speculative_tokens=3
    )
    stats = assert_speculation_keeps_greedy_with_rollbacks(
        functools.partial(kimi, model_dir), batch, NUM_TOKENS, spec
    )
    assert stats.num_accepted_tokens < stats.num_draft_tokens, stats
