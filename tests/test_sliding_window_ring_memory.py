"""``met memory`` of the published Gemma-3-27B and gpt-oss-120b configs with sliding-window
layers in rings per sequence (the default) against ``--sliding-window-cache full``: where the
budget bounds the pool, it holds about 3x (Gemma 3: 52 of 62 layers sliding) and 2x (gpt-oss:
18 of 36) the tokens; where it does not, the rings cost less memory for the same tokens; at
many slots the plan keeps the layers in the pool, where that holds more."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from metrale_testing.engine_parity import met_memory_plan

from metrale_model_arch.memory import SLIDING_WINDOW_KV
from metrale_server.cli.main import main

DATA = Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data"
GEMMA3_27B = DATA / "gemma-3-27b-it"
GPT_OSS_120B = DATA / "gpt-oss-120b"
SERVE = ("--max-seq-len", "32768", "--max-batch-size")


def test_gemma3_27b_on_141_gib_holds_three_times_the_tokens() -> None:
    ring = met_memory_plan(GEMMA3_27B, 141, *SERVE, "32")
    full = met_memory_plan(GEMMA3_27B, 141, *SERVE, "32", "--sliding-window-cache", "full")
    # 32 slots x 52 layers x (K + V) x 2064 tokens (window 1024 + a step of 1024, in blocks of
    # 16, one more) x 16 heads x 128 x 2 bytes.
    assert ring["by_owner"][SLIDING_WINDOW_KV] == 32 * 52 * 2 * 2064 * 16 * 128 * 2
    assert SLIDING_WINDOW_KV not in full["by_owner"]
    assert ring["kv_bytes_per_token"] * 62 == full["kv_bytes_per_token"] * 10
    assert (ring["max_kv_tokens"], full["max_kv_tokens"]) == (328_800, 108_416)
    assert (ring["admitted_sequences"], full["admitted_sequences"]) == (10, 3)


def test_gpt_oss_120b_on_320_gib_holds_twice_the_tokens() -> None:
    ring = met_memory_plan(GPT_OSS_120B, 320, *SERVE, "64")
    full = met_memory_plan(GPT_OSS_120B, 320, *SERVE, "64", "--sliding-window-cache", "full")
    assert ring["by_owner"][SLIDING_WINDOW_KV] == 64 * 18 * 2 * 656 * 8 * 64 * 2
    assert (ring["max_kv_tokens"], full["max_kv_tokens"]) == (728_800, 385_392)
    assert (ring["admitted_sequences"], full["admitted_sequences"]) == (22, 11)


def test_a_pool_the_slots_fill_costs_less_with_rings() -> None:
    # 8 slots of 16384 tokens fit either way: the same tokens, 16.9 GiB less with rings.
    ring = met_memory_plan(GPT_OSS_120B, 400, "--max-seq-len", "16384")
    full = met_memory_plan(
        GPT_OSS_120B, 400, "--max-seq-len", "16384", "--sliding-window-cache", "full"
    )
    assert ring["max_kv_tokens"] == full["max_kv_tokens"] == 8 * 16384
    saved = 8 * 16384 * 18 * 2 * 8 * 64 * 2 - 8 * 18 * 2 * 656 * 8 * 64 * 2
    assert full["used_bytes"] - ring["used_bytes"] == saved


def test_many_short_slots_keep_the_layers_in_the_pool() -> None:
    # 256 slots of Gemma 3 rings (2064 tokens each) would hold more than the pool they free.
    plan = met_memory_plan(GEMMA3_27B, 400, "--max-seq-len", "131072", "--max-batch-size", "256")
    assert SLIDING_WINDOW_KV not in plan["by_owner"]
    assert plan["kv_bytes_per_token"] == 62 * 2 * 16 * 128 * 2


def test_met_memory_prints_the_rings_and_refuses_a_bad_value_by_name() -> None:
    args = ["memory", str(GEMMA3_27B), "--device", "cuda", "--device-memory-gib", "141"]
    args += [*SERVE, "32"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (
        "Sliding-window K/V rings: 26832.0 MiB = 32 seq x 52 layers x 2064 tokens (window 1024 "
        "+ 1024 a step, prefill chunked to 1024)" in result.output
    )
    bad = CliRunner().invoke(main, [*args, "--sliding-window-cache", "rings"])
    assert bad.exit_code == 2
    assert "--sliding-window-cache" in bad.output
    assert "'rings' is not one of 'ring', 'full'" in bad.output
