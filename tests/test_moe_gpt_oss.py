"""The engine on a tiny random ``gpt_oss`` checkpoint (sinks, a 4-token window on every other
layer, the biased MoE): batching, preemption and chunked prefill never change greedy tokens;
plan == ledger byte for byte; ``met memory`` of the published gpt-oss-120b config."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from metrale_testing import save_random_model
from safetensors import safe_open

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import KV_POOL, ROPE_TABLE
from metrale_server import LLM, Engine, EngineArgs, RequestOutput, SamplingParams, build_engine
from metrale_server.cli.main import main

pytest.importorskip("transformers")

GPT_OSS_120B_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/gpt-oss-120b/config.json"
)
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "In 1969, the first humans walked on the moon and then",
    "The three primary colors are",
    "My favourite recipe for pancakes starts with flour, eggs and",
]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MAX_SEQ_LEN = 64
TINY = {
    "intermediate_size": 32,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "sliding_window": 4,
    "swiglu_limit": 1.5,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "truncate": False,
    },
}


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-gpt-oss")
    return save_random_model(path, default_tokenizer, "GptOssConfig", "GptOssForCausalLM", **TINY)


def generate(
    path: Path, prompts: list[str], **engine_args: object
) -> tuple[Engine, list[RequestOutput]]:
    args = EngineArgs(
        model=str(path),
        dtype="float32",
        device="cpu",
        max_seq_len=MAX_SEQ_LEN,
        **engine_args,  # type: ignore[arg-type]
    )
    engine = build_engine(args)
    return engine, LLM.from_engine(engine).generate(prompts, PARAMS)


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [tuple(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def alone(gpt_oss_dir: Path) -> list[tuple[int, ...]]:
    """Each prompt's greedy tokens with one sequence at a time."""
    greedy = tokens(generate(gpt_oss_dir, PROMPTS, max_batch_size=1)[1])
    assert len(set(greedy)) == len(PROMPTS), "a degenerate model proves little"
    return greedy


def test_batched_equals_alone(gpt_oss_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(gpt_oss_dir, PROMPTS, max_batch_size=len(PROMPTS))
    assert tokens(outputs) == alone
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_preemption_equals_alone(gpt_oss_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(gpt_oss_dir, PROMPTS, max_batch_size=len(PROMPTS), num_kv_blocks=6)
    assert engine.stats.num_preemptions > 0
    assert tokens(outputs) == alone


def test_chunked_prefill_equals_alone(gpt_oss_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(
        gpt_oss_dir, PROMPTS, max_batch_size=len(PROMPTS), max_batch_tokens=11
    )
    assert engine.stats.num_partial_prefill_chunks > 0
    assert tokens(outputs) == alone


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan(gpt_oss_dir: Path, dtype: str) -> None:
    config = model_config_from_hf_file(gpt_oss_dir)
    engine = build_engine(
        EngineArgs(
            model=str(gpt_oss_dir),
            dtype=dtype,
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=2,
            max_batch_tokens=64,
        )
    )
    allocated = engine.plan.allocated_by_owner()
    assert engine.ledger.live_bytes_by_owner() == allocated
    assert engine.ledger.live_bytes() == sum(allocated.values())
    # Every saved tensor at the serve dtype but the float32 router, by owner.
    dtype_bytes = 4 if dtype == "float32" else 2
    expected = dict.fromkeys(
        ("weights.embeddings", "weights.layers", "weights.final_norm", "weights.lm_head"), 0
    )
    with safe_open(str(gpt_oss_dir / "model.safetensors"), framework="pt") as saved:
        for name in saved.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
            numel = math.prod(saved.get_slice(name).get_shape())
            size = numel * (4 if ".mlp.router." in name else dtype_bytes)
            if name.startswith("model.layers."):
                expected["weights.layers"] += size
            elif name.startswith("model.embed_tokens."):
                expected["weights.embeddings"] += size
            elif name.startswith("model.norm."):
                expected["weights.final_norm"] += size
            else:
                expected["weights.lm_head"] += size
    assert {o: s for o, s in allocated.items() if o.startswith("weights.")} == expected
    # Both layers (one sliding, one full) cache K and V: 2 heads x 16 values each.
    assert engine.plan.kv_bytes_per_token == config.num_hidden_layers * 2 * 2 * 16 * dtype_bytes
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 16 * 4


def test_met_memory_of_the_published_gpt_oss_120b_config() -> None:
    args = ["memory", str(GPT_OSS_120B_CONFIG), "--device", "cuda", "--device-memory-gib", "400"]
    args += ["--max-batch-size", "8", "--max-seq-len", "16384", "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["model_type"] == "gpt_oss"
    owners = plan["by_owner"]
    weights = sum(size for owner, size in owners.items() if owner.startswith("weights."))
    # 116.83e9 parameters (transformers' count on this config), the MXFP4 experts dequantized
    # to bfloat16 at load, the routers in float32.
    routers = 36 * 128 * (2880 + 1)
    assert weights == 2 * (116_829_156_672 - routers) + 4 * routers
    # 36 layers x 8 KV heads x 64 x (K and V) x 2 bytes (sliding layers priced as full ones).
    assert plan["kv_bytes_per_token"] == 36 * 8 * 64 * 2 * 2
    assert owners[ROPE_TABLE] == 16384 * 64 * 4
