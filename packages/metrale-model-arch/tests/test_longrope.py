"""phi3's LongRoPE served past its original context (32 positions here, 128 the model's): the
long factors for the serve's whole table, so every sequence longer than the original context
gets transformers' logits however it is prefilled and as it decodes past the boundary; one that
stays within it gets the long-factor logits (:mod:`metrale_model_arch.families.rotary`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from metrale_testing.family_parity import (
    FamilyCheckpoint,
    hf_logits,
    load_checkpoint,
    random_prompts,
)
from metrale_testing.greedy import paged_greedy, transformers_greedy

from metrale_model_arch.families.dense_variants import DenseVariantForCausalLM
from metrale_model_arch.families.rotary import longrope_factors

transformers = pytest.importorskip("transformers")

ORIGINAL = 32
MAX_POSITIONS = 128
SHORT = [1.0, 1.1, 1.3, 1.2]
LONG = [1.5, 2.5, 4.0, 7.0]
PHI3: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "partial_rotary_factor": 0.5,
    "max_position_embeddings": MAX_POSITIONS,
    "original_max_position_embeddings": ORIGINAL,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
ATOL = 1e-4
BLOCK_SIZE = 4


def phi3(short_factor: list[float]) -> Any:
    rope = {"rope_type": "longrope", "short_factor": short_factor, "long_factor": LONG}
    return transformers.Phi3Config(**PHI3, rope_parameters=rope)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> FamilyCheckpoint:
    hf_model = transformers.Phi3ForCausalLM(phi3(SHORT)).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            noise = 0.3 * torch.randn(param.shape, generator=generator)
            param.copy_(noise + (1.0 if "norm" in name else 0.0))
    path = tmp_path_factory.mktemp("phi3-longrope")
    hf_model.save_pretrained(path, safe_serialization=True)
    return FamilyCheckpoint.saved("phi3-longrope", path, hf_model, (ORIGINAL + 1, 48, 100, 24))


@pytest.fixture(scope="module")
def long_everywhere(checkpoint: FamilyCheckpoint) -> Any:
    """transformers' model with the long factors in place of the short ones: what it computes
    for a sequence within the original context, had it the long factors."""
    hf_model = transformers.Phi3ForCausalLM(phi3(LONG)).eval()
    hf_model.load_state_dict(checkpoint.hf_model.state_dict())
    return hf_model


def serve(checkpoint: FamilyCheckpoint, max_seq_len: int) -> DenseVariantForCausalLM:
    return load_checkpoint(
        FamilyCheckpoint.saved(
            checkpoint.name, checkpoint.path, checkpoint.hf_model, (), max_seq_len
        ),
        DenseVariantForCausalLM,
    )


def test_the_serves_context_chooses_the_factors(checkpoint: FamilyCheckpoint) -> None:
    config = checkpoint.config
    assert longrope_factors(config, ORIGINAL) == tuple(SHORT)
    assert longrope_factors(config, ORIGINAL + 1) == tuple(LONG)
    assert serve(checkpoint, MAX_POSITIONS).max_seq_len == MAX_POSITIONS


def test_prompts_past_the_original_context_match_transformers(
    checkpoint: FamilyCheckpoint, paged_runner: Any
) -> None:
    runner = paged_runner(serve(checkpoint, MAX_POSITIONS), num_blocks=64, block_size=BLOCK_SIZE)
    long_prompts = {i: p for i, p in checkpoint.prompts.items() if len(p) > ORIGINAL}
    logits = runner.step(long_prompts)
    for seq_id, prompt in long_prompts.items():
        expected = hf_logits(checkpoint.hf_model, prompt)
        torch.testing.assert_close(logits[seq_id], expected, atol=ATOL, rtol=0)


def test_a_long_prompt_prefilled_in_chunks_matches_transformers(
    checkpoint: FamilyCheckpoint, paged_runner: Any
) -> None:
    prompt = checkpoint.prompts[1]
    runner = paged_runner(serve(checkpoint, MAX_POSITIONS), num_blocks=32, block_size=BLOCK_SIZE)
    # The first chunk lies within the original context, the second crosses it.
    chunks = [runner.step({0: prompt[a:b]})[0] for a, b in ((0, 20), (20, 40), (40, 48))]
    expected = hf_logits(checkpoint.hf_model, prompt)
    torch.testing.assert_close(torch.cat(chunks), expected, atol=ATOL, rtol=0)


def test_greedy_decoding_after_a_long_prompt_matches_transformers_generate(
    checkpoint: FamilyCheckpoint, paged_runner: Any
) -> None:
    prompt = checkpoint.prompts[0]
    expected = transformers_greedy(checkpoint.hf_model, prompt, 24)
    runner = paged_runner(serve(checkpoint, MAX_POSITIONS), num_blocks=64, block_size=BLOCK_SIZE)
    assert paged_greedy(runner, {0: prompt}, 24)[0] == expected


def test_decoding_across_the_boundary_is_transformers_from_the_crossing(
    checkpoint: FamilyCheckpoint, long_everywhere: Any, paged_runner: Any
) -> None:
    """transformers' generate recomputes the sequence with the long factors when it passes 32
    tokens: from there on, its logits are ours; before, ours are its long-factor ones."""
    prompt = checkpoint.prompts[3]
    generated = transformers_greedy(checkpoint.hf_model, prompt, 24)
    sequence = prompt + generated
    runner = paged_runner(serve(checkpoint, MAX_POSITIONS), num_blocks=64, block_size=BLOCK_SIZE)
    ours = runner.step({0: prompt})[0][-1:]
    for token in generated[:-1]:
        ours = torch.cat([ours, runner.step({0: [token]})[0]])
    # Row i: the logits after the first len(prompt) + i tokens.
    for i, row in enumerate(ours):
        length = len(prompt) + i
        if length > ORIGINAL:
            expected = hf_logits(checkpoint.hf_model, sequence[:length])[-1]
            torch.testing.assert_close(row, expected, atol=ATOL, rtol=0)
            assert int(row.argmax()) == generated[i]
        else:
            expected = hf_logits(long_everywhere, sequence[:length])[-1]
            torch.testing.assert_close(row, expected, atol=ATOL, rtol=0)
            short = hf_logits(checkpoint.hf_model, sequence[:length])[-1]
            assert (row - short).abs().max() > 100 * ATOL


def test_within_the_original_context_the_short_factors_are_transformers(
    checkpoint: FamilyCheckpoint, paged_runner: Any
) -> None:
    prompts = random_prompts(checkpoint.config.vocab_size, (ORIGINAL, 9), seed=2)
    runner = paged_runner(serve(checkpoint, ORIGINAL), num_blocks=32, block_size=BLOCK_SIZE)
    logits = runner.step(prompts)
    for seq_id, prompt in prompts.items():
        expected = hf_logits(checkpoint.hf_model, prompt)
        torch.testing.assert_close(logits[seq_id], expected, atol=ATOL, rtol=0)
