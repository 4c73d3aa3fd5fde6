"""The check that model and kernel code names the device of every tensor it makes while it
runs: the steps run again with torch's default device ``meta``, where a tensor made without a
device (``torch.arange(n)`` beside a block table) meets the model's CPU tensors and raises, as on
a GPU it would meet CUDA tensors. GLM-5.3's paged indexer once failed on CUDA for exactly this,
which no CPU run could see. Not imported by the plugin: torch is imported at the top."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

NUM_DECODE_STEPS = 3


def assert_tensors_made_on_the_models_device(
    model: Any,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, Sequence[int]],
    **runner_options: Any,
) -> None:
    """Prefill ``prompts`` in one step and decode ``NUM_DECODE_STEPS`` greedy steps twice
    through ``paged_runner(model, ...)`` (the model-arch tests' runner): plainly, and with the
    default device ``meta`` while the model runs. Raises where the model makes a tensor off its
    device; asserts both runs give the same logits (so nothing ran on ``meta``)."""
    plain = paged_runner(model, **runner_options)
    scanned = paged_runner(model, forward_device="meta", **runner_options)
    new_tokens: Mapping[int, Sequence[int]] = prompts
    for _ in range(1 + NUM_DECODE_STEPS):
        expected = plain.step(new_tokens)
        got = scanned.step(new_tokens)
        for seq_id, logits in expected.items():
            assert got[seq_id].device == logits.device
            assert torch.equal(got[seq_id], logits), seq_id
        new_tokens = {seq_id: [int(out[-1].argmax())] for seq_id, out in expected.items()}
