"""``met memory MODEL_DIR`` on the published configs of Qwen3-Next-80B-A3B-Instruct,
Kimi-Linear-48B-A3B-Instruct and gemma-3-27b-it (``packages/metrale-model-arch/tests/data``):
the plan from the config alone, its weights within 1% of the released checkpoint's bytes
(where each number comes from: ``packages/metrale-model-arch/tests/test_published_configs.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from metrale_testing.engine_parity import met_memory_plan, plan_weight_bytes

from metrale_model_arch.memory import MTP, VISION
from metrale_server.cli.main import main

DATA = Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data"
# model dir -> (model type, checkpoint bytes like the plan's, KV bytes per token in bfloat16).
PUBLISHED = {
    # 81,324,862,720 parameters less the MTP layer's 1,650,471,424 (not planned without MTP
    # speculation), bfloat16; 12 gated-attention layers x (K + V) x 2 heads x 256 dims.
    "qwen3-next-80b-a3b-instruct": (
        "qwen3_next",
        2 * (81_324_862_720 - 1_650_471_424),
        12 * 2 * 2 * 256 * 2,
    ),
    # The 20 shards' bytes; 7 MLA layers x (512 latent + 64 RoPE key) per token.
    "kimi-linear-48b-a3b-instruct": ("kimi_linear", 98_245_528_576, 7 * (512 + 64) * 2),
    # 27,432,406,640 parameters with the vision tower, bfloat16; 10 full-attention layers x
    # (K + V) x 16 heads x 128 dims (the 52 sliding layers in rings per sequence).
    "gemma-3-27b-it": ("gemma3", 2 * 27_432_406_640, 10 * 2 * 16 * 128 * 2),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_met_memory_plans_the_published_checkpoint(name: str) -> None:
    model_type, checkpoint_bytes, kv_bytes_per_token = PUBLISHED[name]
    plan = met_memory_plan(DATA / name, device_memory_gib=400)
    assert plan["model_type"] == model_type
    assert abs(plan_weight_bytes(plan) / checkpoint_bytes - 1) < 0.01
    assert MTP not in plan["by_owner"]
    assert (VISION in plan["by_owner"]) == (model_type == "gemma3")
    assert plan["kv_bytes_per_token"] == kv_bytes_per_token
    assert plan["admitted_sequences"] == 8


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_met_memory_prints_the_plan(name: str) -> None:
    args = ["memory", str(DATA / name), "--device", "cuda", "--device-memory-gib", "400"]
    args += ["--max-seq-len", "16384", "--max-batch-size", "8"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{PUBLISHED[name][0]} (config.json at ")
    assert "Weights (16-bit): " in result.output
    assert "Fits: 8 full-length sequence(s) at once" in result.output
