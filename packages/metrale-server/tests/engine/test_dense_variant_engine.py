"""The dense variants (olmo2, granite, smollm3, phi3, gemma2, gemma3_text) in the engine: the
plan equal to the allocation ledger, batched, chunked and preempted runs equal to each prompt
alone, and the eager executor whatever the engine is allowed (the fused llama executors do not
compute these layers)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_config import model_config_from_hf_file
from metrale_model_arch import Tokenizer
from metrale_model_arch.families.compiled_steps import can_compile
from metrale_model_arch.families.dense_variants import DenseVariantForCausalLM
from metrale_model_arch.families.native_steps import native_executor
from metrale_model_arch.memory import KV_POOL, ROPE_TABLE
from metrale_model_arch.rope_layout import num_rope_tables, rotary_dim
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.output.outputs import RequestOutput

MAX_SEQ_LEN = 128
NUM_LAYERS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 16
NUM_PROMPTS = 4
ENGINE: dict[str, Any] = {"dtype": "float32", "device": "cpu", "max_seq_len": MAX_SEQ_LEN}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# name -> (transformers config class, model class, extra config fields)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {
            "embedding_multiplier": 4.0,
            "attention_multiplier": 0.15,
            "residual_multiplier": 0.4,
            "logits_scaling": 3.0,
        },
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"no_rope_layer_interval": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"partial_rotary_factor": 0.5, "sliding_window": 9}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"sliding_window": 9, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 5.0},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"sliding_window": 9, "sliding_window_pattern": 2, "rope_local_base_freq": 100.0},
    ),
}


def save_family(path: Path, family: str, tokenizer: Tokenizer) -> dict[str, int]:
    """A tiny random model of ``family`` with ``tokenizer``; its float32 weight bytes by owner."""
    transformers = pytest.importorskip("transformers")
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=0,
        **extra,
    )
    model = getattr(transformers, model_name)(config)
    is_gemma = family.startswith("gemma")
    generator = torch.Generator().manual_seed(0)
    owners = {"weights.embeddings": 0, "weights.layers": 0, "weights.final_norm": 0}
    owners["weights.lm_head"] = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.02 if is_gemma and "embed" in name else 0.3
            noise = scale * torch.randn(param.shape, generator=generator)
            param.copy_(noise + (1.0 if "norm" in name and not is_gemma else 0.0))
            if name.startswith("lm_head."):
                owners["weights.lm_head"] += 4 * param.numel()
            elif name.startswith("model.embed_tokens."):
                owners["weights.embeddings"] += 4 * param.numel()
            elif name.startswith("model.norm."):
                owners["weights.final_norm"] += 4 * param.numel()
            else:
                owners["weights.layers"] += 4 * param.numel()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)
    return {owner: size for owner, size in owners.items() if size}


@pytest.fixture(scope="module")
def family_dirs(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> dict[str, tuple[Path, dict[str, int]]]:
    saved = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        saved[family] = (path, save_family(path, family, default_tokenizer))
    return saved


def make_prompts(seed: int = 0) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(100, 49152) for _ in range(rng.randint(12, 44))]}
        for _ in range(NUM_PROMPTS)
    ]


def token_ids(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [output.outputs[0].token_ids for output in outputs]


def generate(path: Path, prompts: list[dict[str, list[int]]], **args: Any) -> list[tuple[int, ...]]:
    return token_ids(LLM(str(path), **ENGINE, **args).generate(prompts, GREEDY))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_ledger_equals_plan_by_owner(
    family_dirs: dict[str, tuple[Path, dict[str, int]]], family: str, dtype: str
) -> None:
    path, hf_fp32_weights = family_dirs[family]
    engine = build_engine(
        EngineArgs(
            model=str(path),
            dtype=dtype,
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=2,
            max_batch_tokens=128,
        )
    )
    assert isinstance(engine.loaded.model, DenseVariantForCausalLM)
    live = engine.ledger.live_bytes_by_owner()
    allocated = engine.plan.allocated_by_owner()
    assert live == allocated
    dtype_bytes = 4 if dtype == "float32" else 2
    # The plan against numbers that do not come from the plan's code.
    weights = {owner: size for owner, size in allocated.items() if owner.startswith("weights.")}
    assert weights == {o: s * dtype_bytes // 4 for o, s in hf_fp32_weights.items()}
    assert engine.plan.kv_bytes_per_token == NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_DIM * dtype_bytes
    assert live[KV_POOL] == engine.num_kv_blocks * 16 * engine.plan.kv_bytes_per_token
    config = model_config_from_hf_file(path)
    tables = 2 if family == "gemma3_text" else 1
    assert num_rope_tables(config) == tables
    assert rotary_dim(config) == (HEAD_DIM // 2 if family == "phi3" else HEAD_DIM)
    assert live[ROPE_TABLE] == tables * MAX_SEQ_LEN * rotary_dim(config) * 4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_batched_chunked_and_preempted_equal_alone(
    family_dirs: dict[str, tuple[Path, dict[str, int]]], family: str
) -> None:
    path, _ = family_dirs[family]
    prompts = make_prompts()
    # One sequence at a time: each prompt alone.
    alone = generate(path, prompts, max_batch_size=1)
    assert len({token for tokens in alone for token in tokens}) >= 2 * len(prompts)
    assert generate(path, prompts, max_batch_size=8) == alone
    assert generate(path, prompts, max_batch_size=8, max_batch_tokens=23) == alone
    # 16 blocks of 4 tokens for 4 sequences of up to 52 tokens: preemption and recompute.
    preempted = LLM(str(path), **ENGINE, block_size=4, num_kv_blocks=16)
    assert token_ids(preempted.generate(prompts, GREEDY)) == alone
    assert preempted.engine.scheduler.num_preemptions > 0


def test_the_engine_runs_gemma2_eagerly_even_when_allowed_faster_executors(
    family_dirs: dict[str, tuple[Path, dict[str, int]]],
) -> None:
    path, _ = family_dirs["gemma2"]
    prompts = make_prompts(seed=1)
    eager = LLM(str(path), **ENGINE, enforce_eager=True)
    allowed = LLM(str(path), **ENGINE, enforce_eager=False)
    model = allowed.engine.loaded.model
    assert not can_compile(model)
    assert native_executor(model) is None
    compiler = allowed.engine.core.compiler
    if compiler is not None:
        compiler.wait(timeout=300)
    assert model.executor_name == "eager"
    assert token_ids(allowed.generate(prompts, GREEDY)) == token_ids(
        eager.generate(prompts, GREEDY)
    )


@pytest.mark.parametrize("quantization", ["int8", "q4"])
def test_quantized_weights_are_refused_naming_the_flag_value(
    family_dirs: dict[str, tuple[Path, dict[str, int]]], quantization: str
) -> None:
    path, _ = family_dirs["gemma2"]
    with pytest.raises(ValueError, match=rf"gemma2: {quantization} weights are not supported"):
        build_engine(EngineArgs(model=str(path), quantization=quantization, max_seq_len=64))
