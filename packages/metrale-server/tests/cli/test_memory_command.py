"""``met memory``: the plan from a config alone (a 700B config.json on this machine, the bundled
GGUF's header, a tiny model directory), as text or JSON, with ``--max-batch-size auto``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result

from metrale_config import model_config_from_hf_file
from metrale_model_arch import read_model_config, resolve_model
from metrale_model_arch.memory import KV_POOL, PER_SEQUENCE_STATE, MemoryPlanError
from metrale_server import EngineArgs
from metrale_server.cli.main import main
from metrale_server.memory.preflight import plan_engine_memory

GIB = 2**30
CPU = torch.device("cpu")
FLAT_LEVER = "METRALE_GLM_DSA_INDEXER_FLAT"
# 8 slots: the hand-computed per-sequence figures below are for 8 sequences.
GLM_FITS = ["--device", "cuda", "--device-memory-gib", "1200", "--max-batch-size", "8"]
# transformers' default GLM-5.3: 45 layers, one in four (11) DSA ("indexed_attention"), MLA with
# kv_lora_rank 512 and no decoupled RoPE key, index_head_dim 128, index_kpool 16.
NUM_DSA_LAYERS = 11
MLA_KV_BYTES_PER_TOKEN = NUM_DSA_LAYERS * 512 * 2
PAGED_INDEXER_BYTES_PER_TOKEN = NUM_DSA_LAYERS * 4 * 128
WEIGHT_OWNERS = {"weights.embeddings", "weights.layers", "weights.final_norm", "weights.lm_head"}
# transformers' default GLM-5.3 carries its vision tower (460,072,448 parameters): met serve,
# and met memory's plan of it, take images by default, and so plan the tower, the encoder's
# output cache and its batch activations.
VISION_PARAMS = 460_072_448
GLM_WEIGHT_OWNERS = WEIGHT_OWNERS | {"weights.vision"}
TEXT_ONLY = ["--limit-mm-per-prompt", '{"image": 0}']
PLAN_OWNERS = GLM_WEIGHT_OWNERS | {
    "encoder_cache",
    "encoder_activations",
    "rope_table",
    "kv_pool",
    "per_sequence_state",
    "linear_state_pool",
    "buffer_arena",
    "runtime_headroom",
}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def glm_config_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("glm5-next")
    transformers.Glm5NextConfig().save_pretrained(path)
    return path / "config.json"


def memory(runner: CliRunner, *args: str, env: dict[str, str | None] | None = None) -> Result:
    return runner.invoke(main, ["memory", *args], env=env, catch_exceptions=False)


def memory_json(runner: CliRunner, *args: str, env: dict[str, str | None] | None = None) -> Any:
    result = memory(runner, *args, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_glm_config_fields_the_numbers_below_assume(glm_config_json: Path) -> None:
    text = json.loads(glm_config_json.read_text())["text_config"]
    assert len(text["layer_types"]) == 45
    assert text["layer_types"].count("indexed_attention") == NUM_DSA_LAYERS
    assert text["kv_lora_rank"] == 512
    assert text["index_head_dim"] == 128
    assert text["index_kpool"] == 16


def test_a_700b_config_does_not_fit_this_machine(runner: CliRunner, glm_config_json: Path) -> None:
    result = memory(runner, str(glm_config_json), env={FLAT_LEVER: None})
    assert result.exit_code == 1, result.output
    assert "glm5_next" in result.stdout
    assert "Does not fit (weights)" in result.stderr
    assert "--gpu-memory-utilization" in result.stderr
    assert "KV price: 28160 B/token" in result.stdout  # float32 on the CPU: 4 bytes a value


def test_a_700b_refusal_as_json_names_the_term(runner: CliRunner, glm_config_json: Path) -> None:
    result = memory(runner, str(glm_config_json), "--json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["fits"] is False
    assert document["term"] == "weights"
    assert "--gpu-memory-utilization" in document["error"]
    assert set(document["weights_by_owner"]) == GLM_WEIGHT_OWNERS


@pytest.mark.parametrize("max_seq_len", [16384, 131072])
def test_the_700b_config_fits_1200_gib_with_the_paged_indexer(
    runner: CliRunner, glm_config_json: Path, max_seq_len: int
) -> None:
    plan = memory_json(
        runner,
        str(glm_config_json),
        *GLM_FITS,
        "--max-seq-len",
        str(max_seq_len),
        env={FLAT_LEVER: None},
    )
    assert plan["fits"] is True
    assert plan["device"] == "cuda"
    assert plan["inputs"]["dtype_bytes"] == 2
    assert plan["inputs"]["total_bytes"] == 1200 * GIB
    assert plan["inputs"]["indexer_paged"] is True
    assert plan["inputs"]["max_seq_len"] == max_seq_len
    assert plan["kv_bytes_per_token"] == MLA_KV_BYTES_PER_TOKEN + PAGED_INDEXER_BYTES_PER_TOKEN
    assert plan["kv_block_bytes"] == 16 * plan["kv_bytes_per_token"]
    assert plan["per_sequence_state"] == {"target_layers": 0, "proposer": 0}
    by_owner = plan["by_owner"]
    assert set(by_owner) == PLAN_OWNERS
    assert all(isinstance(v, int) and v >= 0 for v in by_owner.values())
    assert by_owner[PER_SEQUENCE_STATE] == 0
    assert by_owner["linear_state_pool"] > 0  # 34 linear-attention layers
    assert by_owner["weights.lm_head"] == by_owner["weights.embeddings"]  # untied
    assert by_owner["weights.vision"] == 2 * VISION_PARAMS
    assert by_owner[KV_POOL] == plan["kv_blocks"] * plan["kv_block_bytes"]
    assert plan["kv_blocks"] == 8 * (max_seq_len // 16)
    assert plan["admitted_sequences"] == 8
    assert sum(by_owner.values()) == plan["used_bytes"] <= plan["budget_bytes"]
    assert plan["budget_bytes"] == int(1200 * GIB * 0.9)


def test_text_only_plans_no_tower_and_no_encoder(runner: CliRunner, glm_config_json: Path) -> None:
    args = (str(glm_config_json), *GLM_FITS, "--max-seq-len", "16384")
    images = memory_json(runner, *args, env={FLAT_LEVER: None})["by_owner"]
    text = memory_json(runner, *args, *TEXT_ONLY, env={FLAT_LEVER: None})["by_owner"]
    assert set(images) - set(text) == {"weights.vision", "encoder_cache", "encoder_activations"}
    # One image of the processor's default 8,000 tokens, at the text stack's 4,096 in bf16.
    assert images["encoder_cache"] == 8000 * 4096 * 2


@pytest.mark.parametrize("max_seq_len", [16384, 131072])
def test_the_flat_indexer_is_charged_per_sequence(
    runner: CliRunner, glm_config_json: Path, max_seq_len: int
) -> None:
    args = (str(glm_config_json), *GLM_FITS, "--max-seq-len", str(max_seq_len))
    paged = memory_json(runner, *args, env={FLAT_LEVER: None})
    flat = memory_json(runner, *args, env={FLAT_LEVER: "1"})
    assert flat["inputs"]["indexer_paged"] is False
    assert flat["kv_bytes_per_token"] == MLA_KV_BYTES_PER_TOKEN
    assert paged["kv_bytes_per_token"] - flat["kv_bytes_per_token"] == (
        PAGED_INDEXER_BYTES_PER_TOKEN
    )
    # dsa_capacity(n, 16) == n for these n; indexer_state_bytes(c, 128) = c * (4 * 128 + 1).
    per_sequence = NUM_DSA_LAYERS * max_seq_len * (4 * 128 + 1)
    assert flat["per_sequence_state"] == {"target_layers": per_sequence, "proposer": 0}
    assert flat["by_owner"][PER_SEQUENCE_STATE] == 8 * per_sequence
    assert flat["by_owner"]["weights.layers"] == paged["by_owner"]["weights.layers"]


def test_the_flat_indexer_is_logged_in_text(runner: CliRunner, glm_config_json: Path) -> None:
    args = (str(glm_config_json), *GLM_FITS, "--max-seq-len", "16384")
    paged = memory(runner, *args, env={FLAT_LEVER: None})
    flat = memory(runner, *args, env={FLAT_LEVER: "1"})
    assert paged.exit_code == flat.exit_code == 0
    assert "GLM-5.3 DSA indexer: paged" in paged.stdout
    assert "METRALE_GLM_DSA_INDEXER_FLAT=1" in paged.stdout
    assert "Per-sequence state reserve: 0 MiB" in paged.stdout
    assert "GLM-5.3 DSA indexer: paged" not in flat.stdout
    assert "Per-sequence state reserve: 705.4 MiB = 8 seq x (88.2 MiB target DSA" in flat.stdout


def test_the_default_model_plan_from_the_gguf_header(runner: CliRunner) -> None:
    result = memory(runner)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("llama (GGUF file at ")
    assert ".gguf" in result.stdout.splitlines()[0]
    assert "(tied to the embeddings)" in result.stdout
    assert "KV cache: " in result.stdout
    assert "Fits: " in result.stdout
    plan = memory_json(runner)
    config = read_model_config(resolve_model(None))
    assert plan["model_type"] == "llama"
    assert plan["inputs"]["max_seq_len"] == config.max_position_embeddings
    assert plan["by_owner"]["weights.lm_head"] == 0  # SmolLM2 ties its head
    hand = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4
    assert plan["kv_bytes_per_token"] == hand


def test_a_tiny_model_dir_plan_equals_the_plan_functions(
    runner: CliRunner, tiny_model_dir: Path
) -> None:
    flags = ("--max-seq-len", "128", "--max-batch-size", "3", "--dtype", "bfloat16")
    plan = memory_json(runner, str(tiny_model_dir), *flags)
    expected = plan_engine_memory(
        EngineArgs(model=str(tiny_model_dir), max_seq_len=128, max_batch_size=3),
        model_config_from_hf_file(tiny_model_dir),
        device=CPU,
        dtype=torch.bfloat16,
    )
    assert plan["by_owner"] == expected.by_owner()
    assert plan["kv_blocks"] == expected.kv_blocks == 3 * 128 // 16
    assert plan["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert plan["max_batch_size"] == 3
    assert str(tiny_model_dir) in plan["source"]
    # The same from its config.json alone.
    assert (
        memory_json(runner, str(tiny_model_dir / "config.json"), *flags)["by_owner"]
        == (plan["by_owner"])
    )


def test_an_embedding_task_plans_no_head(runner: CliRunner, tiny_model_dir: Path) -> None:
    """``--task embed`` plans the model without its head (the tiny model's is untied)."""
    flags = ("--max-seq-len", "128", "--max-batch-size", "3", "--quantization", "none")
    generate = memory_json(runner, str(tiny_model_dir), *flags)["by_owner"]
    embed = memory_json(runner, str(tiny_model_dir), *flags, "--task", "embed")["by_owner"]
    head = "weights.lm_head"
    assert generate[head] == 49152 * 64 * 4  # vocabulary x hidden, float32
    assert embed.get(head, 0) == 0
    others = {owner: size for owner, size in generate.items() if owner != head}
    assert {owner: size for owner, size in embed.items() if owner != head} == others


def test_a_draft_model_is_planned_from_the_flag(runner: CliRunner, tiny_model_dir: Path) -> None:
    """``--speculative-config`` shapes ``met memory``'s plan as it does the serve's: the draft's
    weights and one draft block per KV block (here the tiny model drafts for itself)."""
    flags = ("--max-seq-len", "128", "--max-batch-size", "3", "--quantization", "none")
    plain = memory_json(runner, str(tiny_model_dir), *flags)["by_owner"]
    speculative = json.dumps(
        {"method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 3}
    )
    owners = memory_json(runner, str(tiny_model_dir), *flags, "--speculative-config", speculative)[
        "by_owner"
    ]
    assert owners["draft_kv_pool"] == owners[KV_POOL] == plain[KV_POOL]
    draft_weights = sum(plain[name] for name in WEIGHT_OWNERS) + plain["rope_table"]
    assert owners["draft_model"] == draft_weights
    bad = memory(runner, str(tiny_model_dir), "--speculative-config", '{"method": "beam"}')
    assert bad.exit_code == 2
    assert "--speculative-config" in bad.stderr


def test_auto_picks_the_count_that_admits_the_most(runner: CliRunner) -> None:
    flags = ("--device", "cpu", "--device-memory-gib", "4", "--max-seq-len", "8192")
    result = memory(runner, *flags, "--max-batch-size", "auto")
    assert result.exit_code == 0, result.output
    (auto_line,) = [
        line for line in result.stdout.splitlines() if line.startswith("--max-batch-size auto:")
    ]
    plan = memory_json(runner, *flags, "--max-batch-size", "auto")
    picked = plan["max_batch_size"]
    assert plan["inputs"]["max_batch_size"] is None
    assert 1 < picked < 128  # the budget, not the cap, decides here
    assert f"auto: {picked} slot(s) admit {plan['admitted_sequences']} sequence(s)" in auto_line
    config = read_model_config(resolve_model(None))
    admitted = {}
    for slots in range(1, picked + 3):
        try:
            admitted[slots] = plan_engine_memory(
                EngineArgs(max_seq_len=8192, max_batch_size=slots),
                config,
                device=CPU,
                dtype=torch.float32,
                total_bytes=4 * GIB,
            ).admitted_sequences
        except MemoryPlanError:
            admitted[slots] = 0
    assert admitted[picked] == plan["admitted_sequences"] == max(admitted.values())
    assert all(admitted[slots] < admitted[picked] for slots in range(1, picked))


def test_auto_on_a_roomy_machine_takes_every_slot(runner: CliRunner, tiny_model_dir: Path) -> None:
    plan = memory_json(
        runner, str(tiny_model_dir), "--max-seq-len", "64", "--max-batch-size", "auto"
    )
    assert plan["max_batch_size"] == 128
    assert plan["kv_blocks"] == 128 * 4


@pytest.mark.parametrize("value", ["0", "x", "-2", "1.5"])
def test_a_bad_max_batch_size_is_refused_naming_the_flag(runner: CliRunner, value: str) -> None:
    result = memory(runner, "--max-batch-size", value)
    assert result.exit_code == 2
    assert "--max-batch-size" in result.output


def test_refusals_as_exit_one_name_the_flag(runner: CliRunner, tiny_model_dir: Path) -> None:
    result = memory(runner, str(tiny_model_dir), "--num-kv-blocks", "1000000000")
    assert result.exit_code == 1
    assert "Does not fit (kv_cache)" in result.stderr
    assert "--num-kv-blocks=1000000000" in result.stderr
    result = memory(runner, str(tiny_model_dir), "--device", "cpu", "--device-memory-gib", "0.1")
    assert result.exit_code == 1
    assert "--max-seq-len=512" in result.stderr


def test_a_missing_model_is_an_error_not_a_traceback(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["memory", str(tmp_path / "nothing-here")])
    assert result.exit_code == 1
    assert "nothing-here" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_int8_weights_are_planned_at_a_byte_plus_a_scale_per_row(runner: CliRunner) -> None:
    config = read_model_config(resolve_model(None))
    plans = {q: memory_json(runner, "--quantization", q) for q in ("none", "int8")}
    assert plans["int8"]["inputs"]["quantization"] == "int8"
    embeddings = {q: plan["by_owner"]["weights.embeddings"] for q, plan in plans.items()}
    assert embeddings["none"] == config.vocab_size * config.hidden_size * 4
    assert embeddings["int8"] == config.vocab_size * (config.hidden_size + 4)
    assert (
        plans["int8"]["by_owner"]["weights.layers"]
        < plans["none"]["by_owner"]["weights.layers"] / 3
    )
    assert "Weights (int8 per channel" in memory(runner, "--quantization", "int8").stdout


def test_an_unknown_quantization_names_the_flag(runner: CliRunner) -> None:
    result = runner.invoke(main, ["memory", "--quantization", "int4"])
    assert result.exit_code == 2
    assert "--quantization" in result.output


def test_glm_on_eight_141_gib_devices_plans_one_rank(
    runner: CliRunner, glm_config_json: Path
) -> None:
    device = ["--device", "cuda", "--device-memory-gib", "141", "--dtype", "bfloat16"]
    whole = memory(runner, str(glm_config_json), *device, "--max-seq-len", "131072")
    assert whole.exit_code == 1
    assert "Does not fit (weights)" in whole.stderr
    flags = [*device, "--max-seq-len", "131072", "--tensor-parallel-size", "8"]
    plan = memory_json(runner, str(glm_config_json), *flags)
    assert plan["fits"] is True
    assert plan["tensor_parallel_size"] == 8
    one_rank = memory_json(
        runner, str(glm_config_json), *GLM_FITS, "--dtype", "bfloat16", "--max-seq-len", "131072"
    )
    by_owner, whole_by_owner = plan["by_owner"], one_rank["by_owner"]
    # The vocabulary splits exactly; the layers a little less (norms and the latent
    # projections are every rank's); MLA's latent KV is every rank's.
    assert by_owner["weights.embeddings"] * 8 == whole_by_owner["weights.embeddings"]
    assert 8 * by_owner["weights.layers"] > whole_by_owner["weights.layers"]
    assert 7 * by_owner["weights.layers"] < whole_by_owner["weights.layers"]
    assert plan["kv_bytes_per_token"] == one_rank["kv_bytes_per_token"]
    text = memory(runner, str(glm_config_json), *flags)
    assert "Tensor parallel size 8: each rank's plan" in text.stdout


def test_a_tensor_parallel_size_that_does_not_split_the_model_names_the_flag(
    runner: CliRunner, glm_config_json: Path
) -> None:
    result = runner.invoke(main, ["memory", str(glm_config_json), "--tensor-parallel-size", "3"])
    assert result.exit_code != 0
    assert "--tensor-parallel-size 3 does not divide" in result.output


def test_an_int8_kv_cache_holds_the_tokens_of_its_smaller_rows(runner: CliRunner) -> None:
    result = memory(runner, "--kv-cache-dtype", "int8")
    assert result.exit_code == 0, result.output
    config = read_model_config(resolve_model(None))
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * (config.head_dim + 2)
    kv_line = next(line for line in result.stdout.splitlines() if line.startswith("KV cache: "))
    assert kv_line.endswith(
        f"({per_token} B/token, int8 K/V + a float16 scale per token and kv head)"
    )
    auto, int8 = memory_json(runner), memory_json(runner, "--kv-cache-dtype", "int8")
    assert int8["inputs"]["kv_cache_dtype"] == "int8"
    assert int8["kv_bytes_per_token"] == per_token
    # The same 4 GiB CPU default: float32 rows of 64 values against 64 bytes and a scale.
    assert int8["max_kv_tokens"] >= 3.5 * auto["max_kv_tokens"]


def test_a_quantized_mla_latent_is_refused_naming_the_flag(
    runner: CliRunner, glm_config_json: Path
) -> None:
    result = runner.invoke(main, ["memory", str(glm_config_json), "--kv-cache-dtype", "fp8"])
    assert result.exit_code != 0
    assert "--kv-cache-dtype fp8_e4m3: glm5_next's MLA latent cache" in result.output
