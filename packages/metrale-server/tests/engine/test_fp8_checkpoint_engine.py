"""An FP8 checkpoint served: dequantized to the serve dtype at load, the engine's plan equal to
its allocation ledger and to a float checkpoint's, and the boot log's word on the format."""

from __future__ import annotations

from pathlib import Path

import pytest
from metrale_testing import save_tiny_llama
from metrale_testing.fp8_checkpoints import LAYOUTS, convert_to_fp8

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Quantization, Tokenizer
from metrale_model_arch.memory.weights import weight_bytes
from metrale_server import EngineArgs, build_engine
from metrale_server.devices import format_choice_lines


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    source = save_tiny_llama(tmp_path_factory.mktemp("float"), default_tokenizer, 128)
    default_tokenizer.save(source)
    path = tmp_path_factory.mktemp("fp8-block")
    convert_to_fp8(source, path, LAYOUTS["fp8-block"])
    return path


def test_the_ledger_is_the_plan_and_the_boot_log_says_dequantized(fp8_checkpoint: Path) -> None:
    engine = build_engine(
        EngineArgs(
            model=str(fp8_checkpoint),
            dtype="float32",
            device="cpu",
            max_seq_len=128,
            max_batch_size=2,
            max_batch_tokens=128,
            enforce_eager=True,
        )
    )
    assert engine.loaded.quantization == Quantization.NONE
    assert engine.ledger.live_bytes_by_owner() == engine.plan.allocated_by_owner()
    expected = weight_bytes(model_config_from_hf_file(fp8_checkpoint), 4).by_owner()
    planned = engine.plan.by_owner()
    assert {owner: planned[owner] for owner in expected} == expected
    (line,) = format_choice_lines(engine.loaded, quantization_flag="auto")[:1]
    assert "fp8 weights (block 32x48) dequantized to float32 at load (W8A16;" in line
