"""Sampled output keeps its distribution under n-gram speculation, through the engine.

The model is a 2-layer Llama built to make drafts matter: its embeddings and head make it
mostly a bigram chain (each token's likeliest successor, ~0.7, is the next one on a 16-token
cycle; its attention and MLP, scaled down, still move the logits with the context), and the
prompt walks a cycle more than twice, so the n-gram proposer drafts the chain and the target
keeps most drafts, several per step. Over many seeds, the first tokens sampled with
speculation must follow the same distribution as without it, by a two-sample chi-square test
on where each sequence follows the chain, where it skips a token of it, where it leaves it
for a token of the prompt, and where for another (``metrale_testing.chain_patterns``, shared
with the MTP test): a verifier that checks a draft against another position's distribution, or
draws its replacement from another position's, or a runner that hands it the wrong logits rows,
keeps and replaces other drafts, with other tokens, than the target's distribution does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from metrale_testing import (
    chain_patterns,
    save_byte_tokenizer,
    successor_cycles,
    two_sample_p_value,
)

from metrale_server import LLM, SamplingParams
from metrale_server.speculative_config import SpeculativeConfig

VOCAB = 258  # <s>, </s> and the 256 byte-level BPE bytes
HIDDEN = 64
CYCLE = 16
# The head's rows have this norm: the successor's logit is ~8 above the others' N(0, 1).
HEAD_NORM = 1.0
# Attention and MLP outputs, scaled from their random initialization.
CONTEXT_SCALE = 0.1
PROMPT_LENGTH = 40
NUM_SEEDS = 500  # per arm
NUM_TOKENS = 6
# Significance: a correct engine fails with probability 1e-6 (a priori, for the fixed seeds).
P_MIN = 1e-6


@pytest.fixture(scope="module")
def chain_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], list[int]]:
    """The model's directory, a prompt that walks one of its cycles, and each token's
    successor on the cycles."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("chain-llama")
    save_byte_tokenizer(path)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(VOCAB, HIDDEN, generator=generator)
    successor = successor_cycles(VOCAB, CYCLE, generator)
    predecessor = torch.empty_like(successor)
    predecessor[successor] = torch.arange(VOCAB)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embeddings)
        # Head row b points along the embedding of b's predecessor: after token a, the
        # (normed) hidden state is near a's embedding, so a's successor scores highest.
        head = embeddings[predecessor]
        model.lm_head.weight.copy_(HEAD_NORM * head / head.norm(dim=-1, keepdim=True))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(CONTEXT_SCALE)
            layer.mlp.down_proj.weight.mul_(CONTEXT_SCALE)
    model.save_pretrained(path, safe_serialization=True)
    prompt = [int(successor[0])]
    while len(prompt) < PROMPT_LENGTH:
        prompt.append(int(successor[prompt[-1]]))
    return path, prompt, successor.tolist()


def sampled(seeds: range) -> list[SamplingParams]:
    return [
        SamplingParams(
            temperature=1.0, top_p=0.95, max_tokens=NUM_TOKENS, ignore_eos=True, seed=seed
        )
        for seed in seeds
    ]


def test_speculation_keeps_the_sampled_distribution(
    chain_model: tuple[Path, list[int], list[int]],
) -> None:
    path, prompt, successor = chain_model
    plain = LLM(str(path), dtype="float32", max_batch_size=256)
    speculative = LLM(
        str(path),
        dtype="float32",
        max_batch_size=256,
        speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=4),
    )
    # Disjoint seeds: the two samples are independent.
    without = chain_patterns(plain, prompt, successor, sampled(range(NUM_SEEDS)))
    with_drafts = chain_patterns(
        speculative, prompt, successor, sampled(range(NUM_SEEDS, 2 * NUM_SEEDS))
    )
    p_value = two_sample_p_value(without, with_drafts)
    assert p_value > P_MIN, (p_value, without.most_common(5), with_drafts.most_common(5))
    stats = speculative.engine.stats
    # Not vacuous: drafts were kept, at every draft position (from the second on, reading
    # another position's distribution changes the tokens) on at least a tenth of the seeds.
    assert stats.num_accepted_tokens >= 0.3 * stats.num_draft_tokens > 0, stats
    assert len(stats.num_accepted_by_position) == 4
    assert min(stats.num_accepted_by_position) >= NUM_SEEDS // 10, stats
