"""The memory preflight: the plan from the config before any weight loads, its boot log, and
``met serve`` refusing, before it binds or loads, a serve that does not fit, naming the flag."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from metrale_config import model_config_from_hf_file
from metrale_model_arch import LoadOptions, load_model
from metrale_model_arch.memory import MemoryPlan, MemoryPlanError
from metrale_server import EngineArgs
from metrale_server.cli.serve_args import ServeArgs
from metrale_server.cli.serve_runtime import ServeError, preflight
from metrale_server.memory.host_memory import host_total_memory_bytes, mem_available_at_start_bytes
from metrale_server.memory.preflight import (
    device_total_bytes,
    plan_engine_memory,
    plan_inputs,
    plan_log_lines,
)

CPU = torch.device("cpu")
GIB = 2**30
# Generous: the interpreter, torch and the model-arch imports on a busy two-core machine.
REFUSAL_DEADLINE_S = 30.0


def tiny_args(model_dir: Path, **fields: object) -> EngineArgs:
    return EngineArgs(model=str(model_dir), device="cpu", dtype="float32", **fields)  # type: ignore[arg-type]


def tiny_plan(model_dir: Path, total_bytes: int | None = None, **fields: object) -> MemoryPlan:
    return plan_engine_memory(
        tiny_args(model_dir, **fields),
        model_config_from_hf_file(model_dir),
        device=CPU,
        dtype=torch.float32,
        total_bytes=total_bytes,
    )


def fit_bytes(plan: MemoryPlan, num_blocks: int) -> int:
    """A budget that holds the plan's weights, reserve and exactly ``num_blocks`` KV blocks."""
    return plan.pre_kv_bytes + plan.reserve_bytes + num_blocks * plan.kv_block_bytes


# --- the plan functions ----------------------------------------------------------------------


def test_cpu_total_is_the_host_total() -> None:
    assert device_total_bytes(CPU) == host_total_memory_bytes()


def test_plan_inputs_come_from_the_args_and_the_config(tiny_model_dir: Path) -> None:
    config = model_config_from_hf_file(tiny_model_dir)
    args = tiny_args(
        tiny_model_dir, gpu_memory_utilization=0.5, max_batch_size=None, max_batch_tokens=300
    )
    inputs = plan_inputs(args, config, device=CPU, dtype=torch.bfloat16)
    assert inputs.device_kind == "cpu"
    assert inputs.total_bytes == host_total_memory_bytes()
    assert inputs.budget_bytes == int(inputs.total_bytes * 0.5)
    assert inputs.dtype_bytes == 2
    assert inputs.max_seq_len == config.max_position_embeddings == 512
    assert inputs.max_batch_size is None
    assert inputs.max_batch_tokens == 300
    assert inputs.spec_on is False
    assert (
        plan_inputs(
            tiny_args(tiny_model_dir, max_seq_len=100), config, device=CPU, dtype=torch.float32
        ).max_seq_len
        == 100
    )


def test_the_indexer_lever_selects_flat_or_paged(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = model_config_from_hf_file(tiny_model_dir)
    args = tiny_args(tiny_model_dir)
    monkeypatch.delenv("METRALE_GLM_DSA_INDEXER_FLAT", raising=False)
    assert plan_inputs(args, config, device=CPU, dtype=torch.float32).indexer_paged is True
    monkeypatch.setenv("METRALE_GLM_DSA_INDEXER_FLAT", "1")
    assert plan_inputs(args, config, device=CPU, dtype=torch.float32).indexer_paged is False


def test_a_budget_of_exactly_one_sequence_fits(tiny_model_dir: Path) -> None:
    probe = tiny_plan(tiny_model_dir, total_bytes=64 * GIB)
    blocks_per_seq = probe.inputs.blocks_per_sequence
    assert blocks_per_seq == 512 // 16
    plan = tiny_plan(
        tiny_model_dir, total_bytes=fit_bytes(probe, blocks_per_seq), gpu_memory_utilization=1.0
    )
    assert plan.kv_blocks == blocks_per_seq
    assert plan.admitted_sequences == 1
    assert plan.used_bytes == plan.budget_bytes


def test_one_block_short_of_one_sequence_is_refused_naming_the_flags(
    tiny_model_dir: Path,
) -> None:
    probe = tiny_plan(tiny_model_dir, total_bytes=64 * GIB)
    short = fit_bytes(probe, probe.inputs.blocks_per_sequence) - 1
    with pytest.raises(MemoryPlanError) as refused:
        tiny_plan(tiny_model_dir, total_bytes=short, gpu_memory_utilization=1.0)
    assert refused.value.term == "kv_cache"
    message = str(refused.value)
    for flag in ("--max-seq-len=512", "--gpu-memory-utilization", "--max-batch-size"):
        assert flag in message


def test_a_budget_below_the_weights_is_refused_naming_the_flag(tiny_model_dir: Path) -> None:
    probe = tiny_plan(tiny_model_dir, total_bytes=64 * GIB)
    with pytest.raises(MemoryPlanError) as refused:
        tiny_plan(tiny_model_dir, total_bytes=probe.pre_kv_bytes - 1, gpu_memory_utilization=1.0)
    assert refused.value.term == "weights"
    assert "--gpu-memory-utilization" in str(refused.value)
    # Exactly the weights, but nothing for the reserve and KV, is the other refusal.
    with pytest.raises(MemoryPlanError) as no_kv:
        tiny_plan(tiny_model_dir, total_bytes=probe.pre_kv_bytes, gpu_memory_utilization=1.0)
    assert no_kv.value.term == "kv_cache"


def test_num_kv_blocks_must_fit(tiny_model_dir: Path) -> None:
    probe = tiny_plan(tiny_model_dir, total_bytes=64 * GIB)
    total = fit_bytes(probe, 100)
    assert (
        tiny_plan(
            tiny_model_dir, total_bytes=total, gpu_memory_utilization=1.0, num_kv_blocks=100
        ).kv_blocks
        == 100
    )
    with pytest.raises(MemoryPlanError) as refused:
        tiny_plan(tiny_model_dir, total_bytes=total, gpu_memory_utilization=1.0, num_kv_blocks=101)
    assert refused.value.term == "kv_cache"
    assert "--num-kv-blocks=101" in str(refused.value)


def test_the_pool_is_clamped_to_what_the_slots_can_use(tiny_model_dir: Path) -> None:
    plan = tiny_plan(tiny_model_dir, total_bytes=64 * GIB, max_batch_size=3)
    assert plan.kv_blocks == 3 * 32
    assert plan.admitted_sequences == 3


def test_the_boot_log_has_a_line_per_owner_and_the_kv_line(tiny_model_dir: Path) -> None:
    plan = tiny_plan(tiny_model_dir, max_batch_size=8)
    config = model_config_from_hf_file(tiny_model_dir)
    lines = plan_log_lines(plan, config)
    for start in (
        "Weights (",
        "RoPE table: ",
        "Per-sequence state reserve: 0 MiB",
        "Buffer arena: ",
        "Runtime headroom: ",
        "KV cache: ",
    ):
        assert sum(line.startswith(start) for line in lines) == 1, start
    assert not any(line.startswith("--max-batch-size auto") for line in lines)
    kv_line = lines[-1]
    match = re.fullmatch(
        r"KV cache: ([\d.]+) GiB total x (\d+)% util = ([\d.]+) GiB budget; ([\d.]+) GiB weights "
        r"\+ ([\d.]+) GiB reserve -> ([\d.]+) GiB for KV -> (\d+) blocks x (\d+) tok/block = "
        r"(\d+) max KV tokens \((\d+) B/token\)",
        kv_line,
    )
    assert match is not None, kv_line
    assert float(match[1]) == pytest.approx(plan.inputs.total_bytes / GIB, abs=0.01)
    assert int(match[2]) == 90
    assert float(match[3]) == pytest.approx(plan.budget_bytes / GIB, abs=0.01)
    assert int(match[7]) == plan.kv_blocks == 8 * 32
    assert int(match[8]) == 16
    assert int(match[9]) == plan.kv_blocks * 16
    assert int(match[10]) == plan.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4


def test_the_boot_log_says_what_auto_picked(tiny_model_dir: Path) -> None:
    plan = tiny_plan(tiny_model_dir, max_batch_size=None, max_seq_len=64)
    lines = plan_log_lines(plan, model_config_from_hf_file(tiny_model_dir))
    (auto,) = [line for line in lines if line.startswith("--max-batch-size auto:")]
    assert f"{plan.max_batch_size} slot(s)" in auto
    assert "--max-seq-len=64" in auto


def test_serve_preflight_samples_mem_available_and_refuses_as_serve_error(
    tiny_model_dir: Path,
) -> None:
    args = ServeArgs(engine_args=tiny_args(tiny_model_dir, max_seq_len=64), served_model_name="t")
    plan = preflight(args)
    assert plan.inputs.max_seq_len == 64
    assert isinstance(mem_available_at_start_bytes(), int)
    refused = ServeArgs(
        engine_args=tiny_args(tiny_model_dir, gpu_memory_utilization=1e-6),
        served_model_name="t",
    )
    with pytest.raises(ServeError, match=r"memory preflight: .*--gpu-memory-utilization"):
        preflight(refused)


def serve_options() -> set[str]:
    from click.testing import CliRunner

    from metrale_server.cli.main import main

    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text))


def named_flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))


def test_every_flag_the_preflight_names_is_a_serve_option(tiny_model_dir: Path) -> None:
    probe = tiny_plan(tiny_model_dir, total_bytes=64 * GIB)
    texts = plan_log_lines(
        tiny_plan(tiny_model_dir, max_batch_size=None, max_seq_len=64),
        model_config_from_hf_file(tiny_model_dir),
    )
    refusals = {
        "weights": {"total_bytes": probe.pre_kv_bytes - 1},
        "kv_cache": {"total_bytes": fit_bytes(probe, 1)},
        "num_kv_blocks": {"total_bytes": fit_bytes(probe, 40), "num_kv_blocks": 41},
    }
    for fields in refusals.values():
        with pytest.raises(MemoryPlanError) as refused:
            tiny_plan(tiny_model_dir, gpu_memory_utilization=1.0, **fields)
        texts.append(str(refused.value))
    named = set().union(*(named_flags(text) for text in texts))
    assert {"--gpu-memory-utilization", "--max-seq-len", "--num-kv-blocks"} <= named
    assert named <= serve_options()


# --- met serve refuses before binding and loading --------------------------------------------


@pytest.fixture(scope="module")
def unloadable_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's config and tokenizer over weights that cannot load: a serve that got
    as far as loading would fail there instead of in the preflight."""
    path = tmp_path_factory.mktemp("unloadable")
    for item in tiny_model_dir.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, path / item.name)
    (path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" * 64)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_model(str(path), LoadOptions(dtype=torch.float32))
    return path


def serve_on_a_taken_port(model_dir: Path, *flags: str) -> tuple[int, str, float]:
    """Run ``met serve`` on a port this test holds; returns (exit status, output, seconds). A
    serve that reached binding would fail naming --host/--port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "metrale_server",
                "serve",
                str(model_dir),
                *flags,
                "--port",
                str(port),
                "--no-tui",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        elapsed = time.monotonic() - started
    return result.returncode, result.stdout + result.stderr, elapsed


def assert_refused_before_binding_and_loading(status: int, output: str, elapsed: float) -> None:
    assert status == 1, output
    assert "memory preflight:" in output
    assert "--host/--port" not in output
    assert "address:" not in output
    assert "cannot load the model" not in output
    assert "model: " not in output
    assert "Traceback" not in output
    assert elapsed < REFUSAL_DEADLINE_S


def test_the_unloadable_dir_fails_at_load_when_the_preflight_passes(
    unloadable_model_dir: Path,
) -> None:
    """The control for the refusals below: without a refusal, the serve binds and then fails
    loading, which is what they show never happens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "metrale_server",
            "serve",
            str(unloadable_model_dir),
            "--max-seq-len",
            "64",
            "--port",
            str(port),
            "--no-tui",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "address:" in output
    assert "cannot load the model" in output


def test_serve_refuses_a_budget_too_small_for_the_weights(unloadable_model_dir: Path) -> None:
    probe = tiny_plan(unloadable_model_dir)
    utilization = probe.pre_kv_bytes / 2 / probe.inputs.total_bytes
    with pytest.raises(MemoryPlanError, match="weights need"):
        tiny_plan(unloadable_model_dir, gpu_memory_utilization=utilization)
    status, output, elapsed = serve_on_a_taken_port(
        unloadable_model_dir, "--gpu-memory-utilization", repr(utilization)
    )
    assert_refused_before_binding_and_loading(status, output, elapsed)
    assert "the weights need" in output
    assert "--gpu-memory-utilization" in output


def test_serve_refuses_a_budget_too_small_for_one_sequence(unloadable_model_dir: Path) -> None:
    probe = tiny_plan(unloadable_model_dir)
    short = fit_bytes(probe, probe.inputs.blocks_per_sequence - 1)
    utilization = short / probe.inputs.total_bytes
    budget = int(probe.inputs.total_bytes * utilization)
    assert probe.pre_kv_bytes + probe.reserve_bytes < budget < fit_bytes(probe, 32)
    with pytest.raises(MemoryPlanError) as refused:
        tiny_plan(unloadable_model_dir, gpu_memory_utilization=utilization)
    assert refused.value.term == "kv_cache"
    status, output, elapsed = serve_on_a_taken_port(
        unloadable_model_dir, "--gpu-memory-utilization", repr(utilization)
    )
    assert_refused_before_binding_and_loading(status, output, elapsed)
    assert "one --max-seq-len=512 sequence needs" in output
    assert "--max-seq-len" in output
    assert "--gpu-memory-utilization" in output


def test_serve_refuses_num_kv_blocks_that_do_not_fit(unloadable_model_dir: Path) -> None:
    status, output, elapsed = serve_on_a_taken_port(
        unloadable_model_dir, "--num-kv-blocks", "1000000000"
    )
    assert_refused_before_binding_and_loading(status, output, elapsed)
    assert "--num-kv-blocks=1000000000" in output


def test_serve_refuses_a_700b_config_without_any_weights(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.Glm5NextConfig().save_pretrained(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    status, output, elapsed = serve_on_a_taken_port(tmp_path)
    assert_refused_before_binding_and_loading(status, output, elapsed)
    assert "the weights need" in output
    assert "--gpu-memory-utilization" in output
