"""The engine on a tiny random ``glm4_moe`` checkpoint that carries its MTP layer: batching,
preemption and chunked prefill never change greedy tokens; plan == ledger byte for byte with
the MTP layer owned by ``weights.mtp``; ``met memory`` of the published GLM-4.5 config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import MTP, ROPE_TABLE, RUNTIME_HEADROOM
from metrale_server import LLM, Engine, EngineArgs, RequestOutput, SamplingParams, build_engine
from metrale_server.cli.main import main

transformers = pytest.importorskip("transformers")

GLM_4_5_CONFIG = (
    Path(__file__).parents[1] / "packages/metrale-model-arch/tests/data/glm-4.5/config.json"
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
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.0,
    "use_qk_norm": True,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def glm4_moe_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    """Every parameter and correction bias random; an MTP layer (layer 2: the last layer's
    tensors renumbered and randomized, plus enorm, hnorm, eh_proj, shared_head.norm)."""
    path = tmp_path_factory.mktemp("tiny-glm4_moe")
    hf_config = transformers.Glm4MoeConfig(
        vocab_size=default_tokenizer.vocab_size,
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        **TINY,
    )
    model = transformers.Glm4MoeForCausalLM(hf_config)
    generator = torch.Generator().manual_seed(0)

    def random(name: str, shape: torch.Size) -> torch.Tensor:
        noise = torch.randn(shape, generator=generator)
        return 1.0 + 0.2 * noise if "norm" in name else 0.2 * noise

    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if "rotary_emb" not in name:
                tensor.copy_(random(name, tensor.shape))
    model.save_pretrained(path, safe_serialization=True)
    file = path / "model.safetensors"
    tensors = load_file(file)
    hidden, last = TINY["hidden_size"], "model.layers.1."
    shapes = {
        "model.layers.2." + name[len(last) :]: tensor.shape
        for name, tensor in tensors.items()
        if name.startswith(last)
    }
    for name in ("enorm", "hnorm", "shared_head.norm"):
        shapes[f"model.layers.2.{name}.weight"] = torch.Size([hidden])
    shapes["model.layers.2.eh_proj.weight"] = torch.Size([hidden, 2 * hidden])
    tensors.update((name, random(name, shape)) for name, shape in shapes.items())
    save_file(tensors, file, metadata={"format": "pt"})
    default_tokenizer.save(path)
    return path


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
def alone(glm4_moe_dir: Path) -> list[tuple[int, ...]]:
    """Each prompt's greedy tokens with one sequence at a time."""
    greedy = tokens(generate(glm4_moe_dir, PROMPTS, max_batch_size=1)[1])
    assert len(set(greedy)) == len(PROMPTS), "a degenerate model proves little"
    return greedy


def test_batched_equals_alone(glm4_moe_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(glm4_moe_dir, PROMPTS, max_batch_size=len(PROMPTS))
    assert tokens(outputs) == alone
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_preemption_equals_alone(glm4_moe_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(glm4_moe_dir, PROMPTS, max_batch_size=len(PROMPTS), num_kv_blocks=6)
    assert engine.stats.num_preemptions > 0
    assert tokens(outputs) == alone


def test_chunked_prefill_equals_alone(glm4_moe_dir: Path, alone: list[tuple[int, ...]]) -> None:
    engine, outputs = generate(
        glm4_moe_dir, PROMPTS, max_batch_size=len(PROMPTS), max_batch_tokens=11
    )
    assert engine.stats.num_partial_prefill_chunks > 0
    assert tokens(outputs) == alone


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ledger_equals_plan_with_the_mtp_owner(glm4_moe_dir: Path, dtype: str) -> None:
    config = model_config_from_hf_file(glm4_moe_dir)
    engine = build_engine(
        EngineArgs(
            model=str(glm4_moe_dir),
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
    # Every saved tensor but the router's float32 ones at the serve dtype, by owner.
    dtype_bytes = 4 if dtype == "float32" else 2
    expected = {"weights.embeddings": 0, "weights.layers": 0, MTP: 0}
    expected.update({"weights.final_norm": 0, "weights.lm_head": 0})
    for name, tensor in load_file(glm4_moe_dir / "model.safetensors").items():
        size = tensor.numel() * (4 if ".mlp.gate." in name else dtype_bytes)
        if name.startswith("model.layers.2."):
            expected[MTP] += size
        elif name.startswith("model.layers."):
            expected["weights.layers"] += size
        elif name.startswith("model.embed_tokens."):
            expected["weights.embeddings"] += size
        elif name.startswith("model.norm."):
            expected["weights.final_norm"] += size
        else:
            expected["weights.lm_head"] += size
    assert {o: s for o, s in allocated.items() if o.startswith("weights.")} == expected
    assert allocated[MTP] > 0
    # Half of each 16-wide head is rotated: an 8-wide float32 table per position.
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * 8 * 4
    assert config.mtp is not None
    assert RUNTIME_HEADROOM not in allocated


def test_met_memory_of_the_published_glm_4_5_config() -> None:
    args = ["memory", str(GLM_4_5_CONFIG), "--device", "cuda", "--device-memory-gib", "1200"]
    args += ["--max-batch-size", "8", "--max-seq-len", "16384", "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["model_type"] == "glm4_moe"
    owners = plan["by_owner"]
    weights = sum(size for owner, size in owners.items() if owner.startswith("weights."))
    # The published checkpoint: ~716 GB in bfloat16 (its MTP layer's copies of the embedding
    # and head are not loaded: MTP shares the target's).
    assert abs(weights / 716e9 - 1) < 0.01
    assert owners[MTP] == 7_977_778_304
    # 92 layers x (K + V) x 8 heads x 128 dims x 2 bytes.
    assert plan["kv_bytes_per_token"] == 92 * 2 * 8 * 128 * 2
