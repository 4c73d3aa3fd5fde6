"""Greedy decoding for the model-parity tests: transformers' ``generate`` on one prompt, and
a paged runner's steps over a batch of prompts (torch imported by the callers' objects only)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol


class StepRunner(Protocol):
    def step(self, tokens: dict[int, list[int]]) -> dict[int, Any]:
        """Each sequence's logits ``(new tokens, vocab)`` after appending its ``tokens``."""
        ...


def transformers_greedy(hf_model: Any, prompt: list[int], num_tokens: int) -> list[int]:
    """The ``num_tokens`` tokens transformers' ``generate`` picks greedily after ``prompt``;
    asserts they are not degenerate (at least 8 distinct), or the comparison proves little."""
    import torch

    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
            max_new_tokens=num_tokens,
            do_sample=False,
        )
    tokens: list[int] = out[0, len(prompt) :].tolist()
    assert len(tokens) == num_tokens
    assert len(set(tokens)) >= 8, "a degenerate model proves little"
    return tokens


def paged_greedy(
    runner: StepRunner, prompts: dict[int, list[int]], num_tokens: int
) -> dict[int, list[int]]:
    """Each sequence's ``num_tokens`` greedy tokens, the prompts prefilled in one step and every
    sequence decoded in the same steps."""
    generated: dict[int, list[int]] = {seq_id: [] for seq_id in prompts}
    new_tokens = prompts
    for _ in range(num_tokens):
        logits = runner.step(new_tokens)
        new_tokens = {seq_id: [int(out[-1].argmax())] for seq_id, out in logits.items()}
        for seq_id, (token,) in new_tokens.items():
            generated[seq_id].append(token)
    return generated


def prefill_hidden(loaded: Any, tokens: Sequence[int], block_size: int = 16) -> Any:
    """The final hidden states ``(tokens, hidden)`` of one fresh sequence's prefill through
    ``loaded`` (a ``LoadedModel``), over a paged KV cache of its own."""
    import torch

    from metrale_kernels import build_attention_metadata
    from metrale_model_arch import allocate_kv_cache

    num_blocks = -(-len(tokens) // block_size)
    kv_caches = allocate_kv_cache(
        loaded.config,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=loaded.dtype,
        device=loaded.device,
    )
    metadata = build_attention_metadata(
        block_tables=[list(range(num_blocks))],
        seq_lens=[len(tokens)],
        query_lens=[len(tokens)],
        block_size=block_size,
    )
    with torch.inference_mode():
        return loaded.model(torch.tensor(tokens), torch.arange(len(tokens)), kv_caches, metadata)


def repeated_phrase_prompts(count: int, seed: int) -> list[list[int]]:
    """Random prompts over SmolLM2's vocabulary, each a short phrase repeated (so n-gram
    lookup finds drafts in them)."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        phrase = [rng.randrange(100, 49152) for _ in range(rng.randint(2, 9))]
        made.append((phrase * 8)[: rng.randint(5, 40)])
    return made
