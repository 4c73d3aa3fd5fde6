"""The engine on a tiny random ``qwen3_next`` checkpoint (Gated DeltaNet, gated attention, a
dense layer beside MoE layers with a gated shared expert): transformers' greedy tokens, batched
in prefill chunks; plan == ledger byte for byte with the KV pool and the linear state pool;
draft-model and n-gram speculation roll the state back and keep the greedy tokens."""

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
from metrale_server import LLM, SamplingParams
from metrale_server.speculative_config import SpeculativeConfig

transformers = pytest.importorskip("transformers")

MAX_SEQ_LEN = 64
NUM_TOKENS = 24
TINY = {
    "hidden_size": 64,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.25,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 12,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "mlp_only_layers": [2],
    "max_position_embeddings": 256,
    "pad_token_id": None,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3-next")
    config = transformers.Qwen3NextConfig(
        vocab_size=default_tokenizer.vocab_size,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        **TINY,
    )
    model = transformers.Qwen3NextForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    randomize_weights(model, generator)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name and "linear_attn" not in name:  # (1 + w) norms: w near 0
                weight.copy_(0.2 * torch.randn(weight.shape, generator=generator))
    model.save_pretrained(path, safe_serialization=True)
    default_tokenizer.save(path)
    return path


def qwen3_next(path: Path, **args: object) -> LLM:
    return LLM(
        str(path), dtype="float32", device="cpu", max_seq_len=MAX_SEQ_LEN, max_batch_size=4,
        **args,
    )  # fmt: skip


def test_batched_greedy_equals_transformers(model_dir: Path) -> None:
    hf_model = transformers.Qwen3NextForCausalLM.from_pretrained(model_dir).eval()
    batch = repeated_phrase_prompts(4, seed=5)
    expected = [transformers_greedy(hf_model, prompt, NUM_TOKENS) for prompt in batch]
    # Prefill chunks of at most 16 tokens: the 4 prompts never fit one step.
    llm = qwen3_next(model_dir, max_batch_tokens=16)
    assert greedy_from_ids(llm, batch, NUM_TOKENS) == expected
    assert llm.engine.stats.num_partial_prefill_chunks > 0


def test_ledger_equals_plan_with_the_kv_and_linear_state_pools(model_dir: Path) -> None:
    # float32: every saved tensor at 4 bytes, by owner (none kept float32 at another dtype).
    engine = assert_ledger_equals_plan(
        model_dir, "float32", max_seq_len=MAX_SEQ_LEN, float32_names="<none>"
    )
    allocated = engine.plan.allocated_by_owner()
    # One attention layer: K and V of 2 heads x 16 dims a token.
    assert engine.plan.kv_bytes_per_token == 2 * 2 * 16 * 4
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    # Two Gated DeltaNet layers: a (4, 12, 8) recurrent state and 2 conv inputs of
    # 2 * 2 * 12 + 4 * 8 channels, for 2 sequences and the dummy slot.
    assert allocated[LINEAR_STATE_POOL] == 2 * 3 * (4 * 12 * 8 + (2 * 2 * 12 + 4 * 8) * 2) * 4
    # A quarter of each 16-wide head rotated: a 4-wide float32 table per position.
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 4 * 4


def test_draft_model_speculation_rolls_the_state_back_and_keeps_greedy_tokens(
    model_dir: Path, tiny_model_dir: Path
) -> None:
    # The tiny random Llama (the same vocabulary) drafts: its drafts are mostly rejected, so
    # the Gated DeltaNet state is rolled back again and again.
    batch = repeated_phrase_prompts(4, seed=5)
    spec = SpeculativeConfig(
        method="draft_model", model=str(tiny_model_dir), num_speculative_tokens=3
    )
    stats = assert_speculation_keeps_greedy_with_rollbacks(
        functools.partial(qwen3_next, model_dir), batch, NUM_TOKENS, spec
    )
    assert stats.num_draft_tokens > 0, stats


def test_ngram_speculation_rolls_the_state_back_and_keeps_greedy_tokens(model_dir: Path) -> None:
    # A random model seldom repeats itself: with these prompts n-gram lookup drafts 5 tokens
    # at 2 steps, all rejected (the Gated DeltaNet state rolled back).
    batch = repeated_phrase_prompts(8, seed=13)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    stats = assert_speculation_keeps_greedy_with_rollbacks(
        functools.partial(qwen3_next, model_dir), batch, NUM_TOKENS, spec
    )
    assert stats.num_accepted_tokens < stats.num_draft_tokens, stats


def test_forked_outputs_go_on_from_the_parents_linear_state(model_dir: Path) -> None:
    # n=2: the second output's slot starts from the first's state after the prompt (before,
    # it started from zeros and drifted off at once).
    batch = repeated_phrase_prompts(2, seed=6)
    llm = qwen3_next(model_dir)
    single = greedy_from_ids(llm, batch, NUM_TOKENS)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, n=2)
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
    forked = [[list(choice.token_ids) for choice in output.outputs] for output in outputs]
    assert forked == [[tokens, tokens] for tokens in single]
