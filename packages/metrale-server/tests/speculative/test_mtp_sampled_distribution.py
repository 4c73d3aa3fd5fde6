"""Sampled output keeps its distribution under MTP speculation, through the engine, on
``glm4_moe`` and on GLM-5.3 (its KDA and indexer state rolled back after each verify step).

A random MTP layer's drafts are almost never kept, so a test with one checks the rejection
path only. These models' MTP layers draft what the target is likely to sample. The target is a
bigram chain, as the n-gram test's model: its embeddings and head make each token's likeliest
successor (~0.6 at temperature 1) the next one on a 16-token cycle, and its attention, linear
attention and MLP outputs, scaled down, still move the logits with the context. The MTP
layer's ``eh_proj`` passes the next token's normed embedding through (its block scaled down as
the target's), so through the target's head it drafts that token's successor, then the
successor's, and so on. The target keeps 35% of the drafts on ``glm4_moe``, 42% on GLM-5.3:
the first about two times in three, the third one in seven.

Over many seeds, the first tokens sampled with speculation must follow the same distribution as
without it, by a two-sample chi-square test on where each sequence follows the chain, where it
skips a token of it, where it leaves it for a token of the prompt (a whole cycle), and where for
another. Each of these broken verifiers fails it on both models (p < 1e-10 measured): one that
keeps every draft, or keeps a draft with probability sqrt(p), checks a draft against the next
position's distribution, draws a rejected draft's replacement from the target's distribution
without the draft removed or from the next position's, or draws the token after the last kept
draft from the row before.

NOTE: the context barely moves these models' logits, so a rollback that leaves the rejected
drafts folded into the KDA state passes here (p = 0.2); ``test_glm5_mtp_engine`` checks the
state itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from metrale_testing import (
    add_glm5_mtp_layer,
    chain_patterns,
    save_byte_tokenizer,
    save_tiny_glm4_moe,
    successor_cycles,
    two_sample_p_value,
)
from safetensors.torch import load_file, save_file

from metrale_server import LLM, SamplingParams
from metrale_server.speculative_config import SpeculativeConfig

VOCAB = 258  # <s>, </s> and the 256 byte-level BPE bytes
HIDDEN = 64
CYCLE = 16
# Attention and MLP outputs, scaled from their random initialization.
CONTEXT_SCALE = 0.1
PROMPT_LENGTH = CYCLE + 1  # one whole cycle, back to its first token
NUM_TOKENS = 6
NUM_DRAFTS = 3
# Significance: a correct engine fails with probability 1e-6 (a priori, for the fixed seeds).
P_MIN = 1e-6
Chain = tuple[Path, list[int], list[int]]


def make_chain(path: Path, head_norm: float) -> tuple[list[int], list[int]]:
    """Rewrite ``path``'s checkpoint into the chain model (its head's rows of norm
    ``head_norm``): a prompt that walks one of its cycles, and each token's successor."""
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(VOCAB, HIDDEN, generator=generator)
    successor = successor_cycles(VOCAB, CYCLE, generator)
    predecessor = torch.empty_like(successor)
    predecessor[successor] = torch.arange(VOCAB)
    # Head row b points along the embedding of b's predecessor: after token a, the (normed)
    # hidden state is near a's embedding, so a's successor scores highest.
    head = embeddings[predecessor]
    head = head_norm * head / head.norm(dim=-1, keepdim=True)
    tensors = load_file(path / "model.safetensors")
    for name, tensor in tensors.items():
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif "o_proj" in name or "down_proj" in name:
            tensor.mul_(CONTEXT_SCALE)
        elif name.endswith("embed_tokens.weight"):
            tensors[name] = embeddings.clone()  # the target's and the MTP layer's copy
        elif name.endswith(("lm_head.weight", "shared_head.head.weight")):
            tensors[name] = head.clone()
        elif name.endswith("eh_proj.weight"):
            tensors[name] = torch.eye(HIDDEN, 2 * HIDDEN)  # enorm(embed(t_{i+1})), not h_i
    save_file(
        {name: tensor.contiguous() for name, tensor in tensors.items()},
        path / "model.safetensors",
        metadata={"format": "pt"},
    )
    prompt = [int(successor[0])]
    while len(prompt) < PROMPT_LENGTH:
        prompt.append(int(successor[prompt[-1]]))
    return prompt, successor.tolist()


@pytest.fixture(scope="module")
def chain_glm4_moe(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """A 2-layer ``glm4_moe`` chain model with one MTP layer."""
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("chain-glm4-moe")
    save_byte_tokenizer(path)
    save_tiny_glm4_moe(
        path, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96,
        moe_intermediate_size=24, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=8,
        num_experts_per_tok=2, n_group=1, topk_group=1, use_qk_norm=True,
        partial_rotary_factor=0.5, max_position_embeddings=256, num_nextn_predict_layers=1,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    return path, *make_chain(path, head_norm=0.8)


@pytest.fixture(scope="module")
def chain_glm5(tiny_glm5_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """The tiny GLM-5.3 (KDA, DSA, MoE, 4 streams), text only, over the byte vocabulary, with an
    MTP layer, as a chain model. The streams' mean and the final norm blur its hidden state
    more than ``glm4_moe``'s: a longer head keeps the successor's probability near 0.6."""
    path = tmp_path_factory.mktemp("chain-glm5") / "model"
    shutil.copytree(tiny_glm5_dir, path)
    config = json.loads((path / "config.json").read_text())
    del config["vision_config"]
    config["text_config"]["vocab_size"] = VOCAB
    (path / "config.json").write_text(json.dumps(config))
    tensors = load_file(path / "model.safetensors")
    text = {
        name: tensor[:VOCAB] if name.endswith(("embed_tokens.weight", "lm_head.weight")) else tensor
        for name, tensor in tensors.items()
        if ".visual." not in name
    }
    save_file(text, path / "model.safetensors", metadata={"format": "pt"})
    save_byte_tokenizer(path)
    add_glm5_mtp_layer(path, torch.Generator().manual_seed(7), source_layer=1)
    return path, *make_chain(path, head_norm=1.0)


def sampled(seeds: range) -> list[SamplingParams]:
    return [
        SamplingParams(
            temperature=1.0, top_p=0.95, max_tokens=NUM_TOKENS, ignore_eos=True, seed=seed
        )
        for seed in seeds
    ]


def check_the_sampled_distribution(chain: Chain, num_seeds: int) -> LLM:
    """Plain and MTP-speculative sampling over ``num_seeds`` seeds each, compared; drafts kept
    and rejected in numbers. Returns the speculative engine's ``LLM``."""
    path, prompt, successor = chain
    args = {"dtype": "float32", "device": "cpu", "max_seq_len": 64, "max_batch_size": 512}
    plain = LLM(str(path), **args)
    spec = SpeculativeConfig(method="mtp", num_speculative_tokens=NUM_DRAFTS)
    speculative = LLM(str(path), **args, speculative_config=spec)
    # Disjoint seeds: the two samples are independent.
    without = chain_patterns(plain, prompt, successor, sampled(range(num_seeds)))
    with_drafts = chain_patterns(
        speculative, prompt, successor, sampled(range(num_seeds, 2 * num_seeds))
    )
    p_value = two_sample_p_value(without, with_drafts)
    assert p_value > P_MIN, (p_value, without.most_common(5), with_drafts.most_common(5))
    stats = speculative.engine.stats
    # Not vacuous: between a fifth and four fifths of the drafts kept, and at every draft
    # position on at least a tenth of the seeds.
    assert 0.2 * stats.num_draft_tokens <= stats.num_accepted_tokens, stats
    assert stats.num_accepted_tokens <= 0.8 * stats.num_draft_tokens, stats
    assert len(stats.num_accepted_by_position) == NUM_DRAFTS
    assert min(stats.num_accepted_by_position) >= num_seeds // 10, stats
    return speculative


def test_mtp_keeps_the_sampled_distribution_on_glm4_moe(chain_glm4_moe: Chain) -> None:
    check_the_sampled_distribution(chain_glm4_moe, num_seeds=500)


def test_mtp_keeps_the_sampled_distribution_on_glm5(chain_glm5: Chain) -> None:
    speculative = check_the_sampled_distribution(chain_glm5, num_seeds=500)
    rollback = speculative.engine.core.rollback
    assert rollback is not None
    assert rollback.num_rollbacks > 0
