"""``met memory --quantization fp8``: the plan prices fp8 projections (a byte a weight and a
float32 scale a row, the rest in the serve dtype) and says so; a Q4_1 GGUF is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Quantization
from metrale_model_arch.memory.weights import weight_bytes
from metrale_server.cli.main import main

FLAGS = ("--max-seq-len", "128", "--max-batch-size", "3", "--dtype", "bfloat16")


def test_the_plan_prices_fp8_weights(tiny_model_dir: Path) -> None:
    runner = CliRunner()
    args = ["memory", str(tiny_model_dir), *FLAGS, "--quantization", "fp8"]
    result = runner.invoke(main, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    owners = json.loads(result.stdout)["by_owner"]
    config = model_config_from_hf_file(tiny_model_dir)
    expected = weight_bytes(config, torch.bfloat16.itemsize, Quantization.FP8).by_owner()
    assert {owner: owners[owner] for owner in expected} == expected
    assert expected["weights.layers"] < weight_bytes(config, 2).by_owner()["weights.layers"]
    text = runner.invoke(main, args, catch_exceptions=False).stdout
    assert "Weights (fp8 per channel + 16-bit embeddings, head, norms and activations)" in text


def test_a_q4_gguf_is_refused_naming_the_flag() -> None:
    result = CliRunner().invoke(main, ["memory", "--quantization", "fp8"])
    assert result.exit_code != 0
    assert "--quantization fp8: the GGUF's projections are Q4_1 blocks" in result.output
