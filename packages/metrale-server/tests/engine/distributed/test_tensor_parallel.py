"""Two ranks over gloo on 127.0.0.1 give what one rank gives: the same greedy tokens, every
step's logits within 1e-5, with batching and preemption; each rank's ledger is its plan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch

from metrale_model_arch.memory import SLIDING_WINDOW_KV
from metrale_server import Engine, EngineArgs, SamplingParams, build_engine
from metrale_server.engine.distributed import WorkerLostError
from metrale_server.engine.distributed.process_group import COLLECTIVE_TIMEOUT_S

PROMPTS = [[1, 2, 3, 400 + i, 500 + 7 * i] * (1 + i % 3) for i in range(5)]


def engine_args(model: Path, world_size: int, num_kv_blocks: int) -> EngineArgs:
    return EngineArgs(
        model=str(model),
        dtype="float32",
        quantization="none",
        block_size=4,
        max_seq_len=128,
        max_batch_size=4,
        max_batch_tokens=64,
        num_kv_blocks=num_kv_blocks,
        tensor_parallel_size=world_size,
    )


def run(engine: Engine, max_tokens: int) -> tuple[list[tuple[int, ...]], list[torch.Tensor]]:
    """Greedy tokens per prompt, and every step's logits rows."""
    runner = engine.core.runner
    forward = runner.forward
    logits: list[torch.Tensor] = []

    def recording(step):  # type: ignore[no-untyped-def]
        rows, read = forward(step)
        logits.append(rows.clone())
        return rows, read

    runner.forward = recording  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{index}", prompt, params)
    tokens: dict[str, tuple[int, ...]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
    return [tokens[f"r{i}"] for i in range(len(PROMPTS))], logits


def drain(engine: Engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


@pytest.fixture(params=["llama", "qwen3", "qwen3_moe"])
def model_dir(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tiny_qwen3_dir: Path,
    tiny_qwen3_moe_dir: Path,
) -> Path:
    return {"llama": tiny_model_dir, "qwen3": tiny_qwen3_dir, "qwen3_moe": tiny_qwen3_moe_dir}[
        request.param
    ]


@pytest.mark.parametrize("num_kv_blocks", [64, 12])  # 12 blocks of 4: preemptions
def test_two_ranks_match_one(model_dir: Path, num_kv_blocks: int) -> None:
    single = build_engine(engine_args(model_dir, 1, num_kv_blocks))
    expected_tokens, expected_logits = run(single, max_tokens=8)
    split = build_engine(engine_args(model_dir, 2, num_kv_blocks))
    try:
        tokens, logits = run(split, max_tokens=8)
        assert split.stats.num_preemptions == single.stats.num_preemptions
        assert (split.stats.num_preemptions > 0) == (num_kv_blocks == 12)
    finally:
        split.close()
    assert tokens == expected_tokens
    assert len(logits) == len(expected_logits)
    for got, want in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-5)


def test_two_ranks_match_one_over_sliding_window_rings(ringed_mistral_dir: Path) -> None:
    # No fixed pool, so the plan rings the windowed layers, each rank its heads' K/V; steps of
    # 8 tokens make rings of 16 (a window of 4), which the 17-27 token sequences wrap.
    args = attrs.evolve(
        engine_args(ringed_mistral_dir, 1, 64), num_kv_blocks=None, max_batch_tokens=8
    )
    single = build_engine(args)
    expected_tokens, expected_logits = run(single, max_tokens=12)
    split = build_engine(attrs.evolve(args, tensor_parallel_size=2))
    try:
        tokens, logits = run(split, max_tokens=12)
        rings = split.ledger.live_bytes_by_owner()[SLIDING_WINDOW_KV]
        assert rings * 2 == single.ledger.live_bytes_by_owner()[SLIDING_WINDOW_KV]
    finally:
        split.close()
    assert tokens == expected_tokens
    for got, want in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-5)


def test_every_rank_allocates_its_plan_of_half_the_heads(tiny_model_dir: Path) -> None:
    single = build_engine(engine_args(tiny_model_dir, 1, 64))
    split = build_engine(engine_args(tiny_model_dir, 2, 64))
    try:
        memory = split.core.rank_memory
    finally:
        split.close()
    assert [m.rank for m in memory] == [0, 1]
    whole = single.plan.allocated_by_owner()
    for rank in memory:
        assert rank.ledger_by_owner == rank.planned_by_owner
        # 2 KV heads: one a rank; the vocabulary's rows split in two.
        assert rank.planned_by_owner["kv_pool"] * 2 == whole["kv_pool"]
        assert rank.planned_by_owner["weights.embeddings"] * 2 == whole["weights.embeddings"]
        assert rank.planned_by_owner["weights.layers"] < whole["weights.layers"]


def test_a_killed_worker_fails_the_step_naming_its_rank(tiny_model_dir: Path) -> None:
    engine = build_engine(engine_args(tiny_model_dir, 2, 64))
    try:
        assert engine.core.parallel is not None
        worker = engine.core.parallel.processes[0]
        worker.kill()
        worker.join(10)
        start = time.monotonic()
        engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
        with pytest.raises(WorkerLostError, match=r"rank 1 \(pid \d+\) exited with code -9"):
            drain(engine)
        assert time.monotonic() - start < 30
    finally:
        engine.close()
    assert not worker.is_alive()


def test_a_hung_worker_fails_the_step_within_the_collective_timeout(tiny_model_dir: Path) -> None:
    engine = build_engine(engine_args(tiny_model_dir, 2, 64))
    try:
        assert engine.core.parallel is not None
        worker = engine.core.parallel.processes[0]
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGSTOP)
        start = time.monotonic()
        engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
        with pytest.raises(WorkerLostError, match=rf"rank 1 \(pid {worker.pid}\) is stopped"):
            drain(engine)
        assert time.monotonic() - start < COLLECTIVE_TIMEOUT_S + 10
    finally:
        engine.close()
    assert not worker.is_alive()


RANK_ZERO_DIES = """
import os, signal, sys
from metrale_server import LLM

if __name__ == "__main__":
    llm = LLM(sys.argv[1], dtype="float32", quantization="none", num_kv_blocks=64,
              max_seq_len=128, tensor_parallel_size=2)
    print(llm.engine.core.parallel.processes[0].pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_end_when_rank_zero_is_killed(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "rank_zero_dies.py"
    script.write_text(RANK_ZERO_DIES)
    result = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    worker_pid = int(result.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker_pid, signal.SIGKILL)
    pytest.fail(f"worker {worker_pid} outlived rank 0 by 30 s")


def test_four_ranks_over_two_kv_heads_replicate_them(tiny_model_dir: Path) -> None:
    single = build_engine(engine_args(tiny_model_dir, 1, 64))
    expected_tokens, expected_logits = run(single, max_tokens=4)
    split = build_engine(engine_args(tiny_model_dir, 4, 64))
    try:
        tokens, logits = run(split, max_tokens=4)
        memory = split.core.rank_memory
    finally:
        split.close()
    assert tokens == expected_tokens
    for got, want in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-5)
    # One KV head a rank (each of the two held by two ranks): half of one rank's pool at 1.
    whole_kv = single.plan.allocated_by_owner()["kv_pool"]
    assert [m.planned_by_owner["kv_pool"] * 2 for m in memory] == [whole_kv] * 4


# An activation written in two int8 digits moves by one step, max|x| / 64516, when an upstream
# float rounding (the order of a split's partial sums) tips a digit's rounding.
DIGIT_STEP = 1 / (127 * 508)


def split_bound(quantization: str, kernel_backend: str, logits: torch.Tensor) -> float:
    """How far a split step's logits may be from one process's, by format and backend."""
    if quantization == "bfloat16":
        # Partial products summed in float32, rounded once; a rounding tipped upstream moves a
        # 16-bit activation by one step (measured: 3 steps of the largest logit).
        return 4 * torch.finfo(torch.bfloat16).eps * logits.abs().max().item()
    if quantization == "int8" and kernel_backend == "torch":
        return 0.0  # the whole row's scales, int32 sums: the same ops, bit for bit
    # q4's float partial sums (and, on the cpu backend, one process's fused native layer ops
    # against the split's per-op path) differ by float rounding, which tips a few digits in each
    # layer (measured: up to ~10 steps of the largest logit over the tiny llama's two layers).
    return 32 * DIGIT_STEP * logits.abs().max().item()


@pytest.mark.parametrize("kernel_backend", ["torch", "auto"])
@pytest.mark.parametrize(
    ("model", "quantization"),
    [("llama", "int8"), ("qwen3", "int8"), ("llama", "q4"), ("llama", "bfloat16")],
)
def test_split_formats_give_one_process_logits(
    model: str, quantization: str, kernel_backend: str, tiny_model_dir: Path, tiny_qwen3_dir: Path
) -> None:
    """int8 rows scaled over the whole row with int32 partial sums added, q4's digits over the
    whole row: a split quantized model gives one process's greedy tokens, its logits within
    float rounding (int8 on the per-op path: bit for bit)."""
    path = {"llama": tiny_model_dir, "qwen3": tiny_qwen3_dir}[model]
    one = attrs.evolve(engine_args(path, 1, 64), kernel_backend=kernel_backend)
    if quantization == "bfloat16":
        one = attrs.evolve(one, dtype="bfloat16")
    else:
        one = attrs.evolve(one, quantization=quantization)
    expected_tokens, expected_logits = run(build_engine(one), max_tokens=8)
    split = build_engine(attrs.evolve(one, tensor_parallel_size=2))
    try:
        assert split.loaded.quantization == one.quantization
        tokens, logits = run(split, max_tokens=8)
        memory = split.core.rank_memory
    finally:
        split.close()
    assert all(m.ledger_by_owner == m.planned_by_owner for m in memory)
    assert tokens == expected_tokens
    for got, want in zip(logits, expected_logits, strict=True):
        bound = split_bound(quantization, kernel_backend, want.float())
        torch.testing.assert_close(got.float(), want.float(), rtol=0.0, atol=bound)
