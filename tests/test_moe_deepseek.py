"""The engine on tiny random ``deepseek_v2`` (V2-Lite's shape: q_proj, greedy routing) and
``deepseek_v3`` checkpoints: batching, preemption and chunked prefill never change greedy
tokens; plan == ledger byte for byte with the latent KV pool; ``met memory`` of the published
DeepSeek-V3 config."""

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
from metrale_model_arch.memory import KV_POOL, ROPE_TABLE, RUNTIME_HEADROOM
from metrale_server import LLM, Engine, EngineArgs, RequestOutput, SamplingParams, build_engine
from metrale_server.cli.main import main

pytest.importorskip("transformers")

DEEPSEEK_V3_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/deepseek-v3/config.json"
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
MLA = {
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
}
# model type -> (transformers config class, model class, fields beyond MLA's)
TINY: dict[str, tuple[str, str, dict[str, object]]] = {
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        {"q_lora_rank": None, "topk_method": "greedy", "n_shared_experts": 2},
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {"q_lora_rank": 24, "n_group": 2, "topk_group": 1, "n_shared_experts": 1},
    ),
}


@pytest.fixture(scope="module", params=list(TINY))
def deepseek_dir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    default_tokenizer: Tokenizer,
) -> Path:
    config_name, model_name, extra = TINY[request.param]
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    return save_random_model(path, default_tokenizer, config_name, model_name, **MLA, **extra)


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
def alone(deepseek_dir: Path) -> list[tuple[int, ...]]:
    """Each prompt's greedy tokens with one sequence at a time."""
    greedy = tokens(generate(deepseek_dir, PROMPTS, max_batch_size=1)[1])
    assert len(set(greedy)) == len(PROMPTS), "a degenerate model proves little"
    return greedy


def test_batched_equals_alone(deepseek_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(deepseek_dir, PROMPTS, max_batch_size=len(PROMPTS))
    assert tokens(outputs) == alone
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_preemption_equals_alone(deepseek_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(deepseek_dir, PROMPTS, max_batch_size=len(PROMPTS), num_kv_blocks=6)
    assert engine.stats.num_preemptions > 0
    assert tokens(outputs) == alone


def test_chunked_prefill_equals_alone(deepseek_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(
        deepseek_dir, PROMPTS, max_batch_size=len(PROMPTS), max_batch_tokens=11
    )
    assert engine.stats.num_partial_prefill_chunks > 0
    assert tokens(outputs) == alone


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan_with_the_latent_pool(deepseek_dir: Path, dtype: str) -> None:
    config = model_config_from_hf_file(deepseek_dir)
    engine = build_engine(
        EngineArgs(
            model=str(deepseek_dir),
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
    # Every saved tensor at the serve dtype but the float32 router (and V3's bias), by owner.
    dtype_bytes = 4 if dtype == "float32" else 2
    expected = {"weights.embeddings": 0, "weights.layers": 0}
    expected.update({"weights.final_norm": 0, "weights.lm_head": 0})
    with safe_open(str(deepseek_dir / "model.safetensors"), framework="pt") as saved:
        for name in saved.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
            numel = math.prod(saved.get_slice(name).get_shape())
            size = numel * (4 if ".mlp.gate." in name else dtype_bytes)
            if name.startswith("model.layers."):
                expected["weights.layers"] += size
            elif name.startswith("model.embed_tokens."):
                expected["weights.embeddings"] += size
            elif name.startswith("model.norm."):
                expected["weights.final_norm"] += size
            else:
                expected["weights.lm_head"] += size
    assert {o: s for o, s in allocated.items() if o.startswith("weights.")} == expected
    # Each layer caches 32 latent + 8 RoPE-key values a token, once for all heads.
    per_token = config.num_hidden_layers * (32 + 8) * dtype_bytes
    assert engine.plan.kv_bytes_per_token == per_token
    assert allocated[KV_POOL] == engine.num_kv_blocks * engine.plan.kv_block_bytes
    # An 8-wide float32 RoPE table per position (qk_rope_head_dim).
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 8 * 4
    assert RUNTIME_HEADROOM not in allocated


def test_met_memory_of_the_published_deepseek_v3_config() -> None:
    args = ["memory", str(DEEPSEEK_V3_CONFIG), "--device", "cuda", "--device-memory-gib", "1600"]
    args += ["--max-batch-size", "8", "--max-seq-len", "16384", "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["model_type"] == "deepseek_v3"
    owners = plan["by_owner"]
    weights = sum(size for owner, size in owners.items() if owner.startswith("weights."))
    # 671.03e9 parameters (transformers' count on this config; the MTP layer not loaded) in
    # bfloat16, the routers and correction biases in float32.
    assert weights == 2 * 671_026_419_200 + 2 * 58 * 256 * (7168 + 1)
    # 61 layers x (512 latent + 64 RoPE key) x 2 bytes: one row per token for all 128 heads.
    assert plan["kv_bytes_per_token"] == 61 * 576 * 2
    assert owners[ROPE_TABLE] == 16384 * 64 * 4
