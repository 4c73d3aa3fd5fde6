"""The model runner's persistent step inputs equal the metadata built from scratch each step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_kernels import AttentionMetadata, build_attention_metadata
from metrale_server import EngineArgs, SamplingParams, build_engine
from metrale_server.engine.scheduler_step import SchedulerStep


def reference_metadata(step: SchedulerStep, block_size: int) -> AttentionMetadata:
    return build_attention_metadata(
        block_tables=[chunk.seq.block_table for chunk in step.chunks],
        seq_lens=[chunk.start + chunk.num_new_tokens for chunk in step.chunks],
        query_lens=[chunk.num_new_tokens for chunk in step.chunks],
        block_size=block_size,
        state_slots=[chunk.seq.slot for chunk in step.chunks],  # type: ignore[misc]
    )


@pytest.mark.parametrize("num_kv_blocks", [None, 16])  # 16 blocks: preemptions and CoW
def test_step_inputs_match_a_rebuild_from_the_block_tables(
    tiny_model_dir: Path, num_kv_blocks: int | None
) -> None:
    engine = build_engine(
        EngineArgs(
            model=str(tiny_model_dir),
            dtype="float32",
            max_batch_size=6,
            max_batch_tokens=40,
            block_size=4,
            num_kv_blocks=num_kv_blocks,
        )
    )
    runner = engine.core.runner
    original = runner.prepare_inputs
    num_checked = 0

    def checked(step: SchedulerStep) -> Any:
        nonlocal num_checked
        input_ids, positions, metadata, logits_indices, reads = original(step)
        expected = reference_metadata(step, 4)
        rows = zip(step.chunks, metadata.block_tables, expected.block_tables, strict=True)
        for chunk, table, row in rows:
            used = -(-(chunk.start + chunk.num_new_tokens) // 4)  # the blocks its context uses
            assert table[:used].tolist() == row[:used].tolist()
        assert metadata.block_tables.shape[1] == -(-max(expected.seq_lens) // 4)
        assert torch.equal(metadata.slot_mapping, expected.slot_mapping)
        assert torch.equal(metadata.query_start_loc, expected.query_start_loc)
        assert torch.equal(metadata.seq_lens_tensor, expected.seq_lens_tensor)
        assert metadata.state_slots is not None
        assert torch.equal(metadata.state_slots, expected.state_slots)  # type: ignore[arg-type]
        assert (metadata.query_lens, metadata.seq_lens) == (expected.query_lens, expected.seq_lens)
        num_checked += 1
        return input_ids, positions, metadata, logits_indices, reads

    runner.prepare_inputs = checked  # type: ignore[method-assign]
    shared = list(range(300, 313))
    for index in range(10):
        prompt = shared + [400 + index] * (index % 4 + 1) if index % 2 else [500 + index] * 9
        params = SamplingParams(temperature=0.0, max_tokens=6 + index, n=2 if index == 3 else 1)
        engine.add_request(f"r{index}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    assert num_checked > 10
    if num_kv_blocks is not None:
        assert engine.stats.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    assert engine.scheduler.slots.num_free == engine.max_batch_size
