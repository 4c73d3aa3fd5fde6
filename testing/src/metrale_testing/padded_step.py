"""The property CUDA graphs rely on, checked on the CPU: a decode step padded to a capture
bucket with dummy rows (each a one-token sequence at position 0, given back after the step, as
a graph's padding rows are) gives the real rows bit-identical logits. Not imported by the
plugin: torch is imported at the top."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

NUM_DECODE_STEPS = 3
PAD_TOKEN = 0
# Sequence ids of the padding rows: past any test's own.
FIRST_PAD_ID = 1_000_000


def assert_padding_rows_change_nothing(
    model: Any,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, Sequence[int]],
    bucket: int,
    **runner_options: Any,
) -> None:
    """Prefill ``prompts`` in one step, then decode ``NUM_DECODE_STEPS`` greedy steps through
    two ``paged_runner(model, ...)`` (the model-arch tests' runner): one with the real rows
    only, one with rows added up to ``bucket``. The real rows' logits must be equal, bit for
    bit, at every step."""
    num_pads = bucket - len(prompts)
    assert num_pads > 0, f"{len(prompts)} prompts fill a bucket of {bucket}"
    plain = paged_runner(model, **runner_options)
    padded = paged_runner(model, **runner_options)
    expected = plain.step(prompts)
    got = padded.step(prompts)
    for _ in range(NUM_DECODE_STEPS):
        for seq_id, logits in expected.items():
            assert torch.equal(got[seq_id], logits), seq_id
        new_tokens = {seq_id: [int(out[-1].argmax())] for seq_id, out in expected.items()}
        pads = {FIRST_PAD_ID + index: [PAD_TOKEN] for index in range(num_pads)}
        expected = plain.step(new_tokens)
        got = padded.step({**new_tokens, **pads})
        for pad_id in pads:
            padded.free(pad_id)
    for seq_id, logits in expected.items():
        assert torch.equal(got[seq_id], logits), seq_id
