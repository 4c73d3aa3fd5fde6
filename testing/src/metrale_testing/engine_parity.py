"""The engine checks a model family's tiny random checkpoint runs (greedy, float32, on the CPU):
batching, preemption and chunked prefill never change a prompt's greedy tokens; plan == ledger
byte for byte, the weights priced by owner from the saved tensors; ``met memory`` of a
published config.

A test module makes a module-scoped ``model_dir`` fixture (the checkpoint's directory, with a
tokenizer) and collects the greedy checks as a class::

    class TestGreedy(EngineGreedyChecks):
        max_seq_len = 64

Not imported by the plugin: the metrale packages are imported here at the top.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from metrale_model_arch.memory import MTP
from metrale_server import (
    LLM,
    Engine,
    EngineArgs,
    EngineStats,
    RequestOutput,
    SamplingParams,
    build_engine,
)
from metrale_server.cli.main import main
from metrale_server.speculative_config import SpeculativeConfig

PROMPTS = (
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "In 1969, the first humans walked on the moon and then",
    "The three primary colors are",
    "My favourite recipe for pancakes starts with flour, eggs and",
)
Greedy = list[tuple[int, ...]]


def tokens(outputs: list[RequestOutput]) -> Greedy:
    return [tuple(o.outputs[0].token_ids) for o in outputs]


class EngineGreedyChecks:
    """Each of ``prompts``' ``max_tokens`` greedy tokens (``ignore_eos``) are the same batched,
    under preemption (``preemption_num_kv_blocks`` blocks) and in prefill chunks of at most
    ``chunk_max_batch_tokens`` tokens as alone: one engine at ``max_batch_size`` 1, or with
    ``is_alone_one_engine_per_prompt`` one engine per prompt."""

    prompts: ClassVar[tuple[str, ...]] = PROMPTS
    max_seq_len: ClassVar[int] = 64
    max_tokens: ClassVar[int] = 12
    preemption_num_kv_blocks: ClassVar[int] = 6
    chunk_max_batch_tokens: ClassVar[int] = 11
    is_alone_one_engine_per_prompt: ClassVar[bool] = False

    @classmethod
    def generate(cls, path: Path, prompts: list[str], **engine_args: Any) -> tuple[Engine, Greedy]:
        args = EngineArgs(
            model=str(path),
            dtype="float32",
            device="cpu",
            max_seq_len=cls.max_seq_len,
            **engine_args,
        )
        engine = build_engine(args)
        params = SamplingParams(temperature=0.0, max_tokens=cls.max_tokens, ignore_eos=True)
        return engine, tokens(LLM.from_engine(engine).generate(prompts, params))

    @pytest.fixture(scope="class")
    @classmethod
    def alone(cls, model_dir: Path) -> Greedy:
        """Each prompt's greedy tokens with one sequence at a time."""
        if cls.is_alone_one_engine_per_prompt:
            greedy = [cls.generate(model_dir, [p], max_batch_size=1)[1][0] for p in cls.prompts]
        else:
            greedy = cls.generate(model_dir, list(cls.prompts), max_batch_size=1)[1]
        assert len(set(greedy)) == len(cls.prompts), "a degenerate model proves little"
        return greedy

    @classmethod
    def generate_batched(cls, path: Path, **engine_args: Any) -> tuple[Engine, Greedy]:
        """Every prompt in one engine that batches them all."""
        prompts = list(cls.prompts)
        return cls.generate(path, prompts, max_batch_size=len(prompts), **engine_args)

    def test_batched_equals_alone(self, model_dir: Path, alone: Greedy) -> None:
        engine, greedy = self.generate_batched(model_dir)
        assert greedy == alone
        assert engine.block_manager.num_free_blocks == engine.num_kv_blocks

    def test_preemption_equals_alone(self, model_dir: Path, alone: Greedy) -> None:
        engine, greedy = self.generate_batched(
            model_dir, num_kv_blocks=self.preemption_num_kv_blocks
        )
        assert engine.stats.num_preemptions > 0
        assert greedy == alone

    def test_chunked_prefill_equals_alone(self, model_dir: Path, alone: Greedy) -> None:
        engine, greedy = self.generate_batched(
            model_dir, max_batch_tokens=self.chunk_max_batch_tokens
        )
        assert engine.stats.num_partial_prefill_chunks > 0
        assert greedy == alone


WEIGHT_OWNERS = ("weights.embeddings", "weights.layers", "weights.final_norm", "weights.lm_head")


def assert_ledger_equals_plan(
    path: Path,
    dtype: str,
    *,
    max_seq_len: int,
    float32_names: str,
    mtp_prefix: str | None = None,
) -> Engine:
    """An engine on ``path`` at ``dtype`` (2 sequences, 64 tokens a step) whose ledger holds
    exactly its plan's bytes, owner by owner, and whose ``weights.*`` owners hold every saved
    tensor at the serve dtype (float32 where the name contains ``float32_names``), those under
    ``mtp_prefix`` as ``weights.mtp`` (the engine then speculates with them: it loads them
    only to); returned for the family's own checks."""
    speculative = None if mtp_prefix is None else SpeculativeConfig.from_json(MTP_SPECULATION)
    engine = build_engine(
        EngineArgs(
            model=str(path),
            dtype=dtype,
            device="cpu",
            max_seq_len=max_seq_len,
            max_batch_size=2,
            max_batch_tokens=64,
            speculative_config=speculative,
        )
    )
    allocated = engine.plan.allocated_by_owner()
    assert engine.ledger.live_bytes_by_owner() == allocated
    assert engine.ledger.live_bytes() == sum(allocated.values())
    dtype_bytes = 4 if dtype == "float32" else 2
    expected = dict.fromkeys(WEIGHT_OWNERS, 0)
    if mtp_prefix is not None:
        expected[MTP] = 0
    with safe_open(str(path / "model.safetensors"), framework="pt") as saved:
        for name in saved.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
            numel = math.prod(saved.get_slice(name).get_shape())
            size = numel * (4 if float32_names in name else dtype_bytes)
            if mtp_prefix is not None and name.startswith(mtp_prefix):
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
    return engine


MTP_SPECULATION = '{"method": "mtp", "num_speculative_tokens": 1}'


def met_memory_plan(config: Path, device_memory_gib: int, *flags: str) -> dict[str, Any]:
    """``met memory --json`` of ``config`` on a CUDA device of ``device_memory_gib`` GiB, 8
    sequences of 16384 tokens, and ``flags``."""
    args = ["memory", str(config), "--device", "cuda", "--device-memory-gib"]
    args += [str(device_memory_gib), "--max-batch-size", "8", "--max-seq-len", "16384", "--json"]
    args += flags
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def plan_weight_bytes(plan: dict[str, Any]) -> int:
    """The bytes of every ``weights.*`` owner in a ``met memory --json`` plan."""
    return sum(size for owner, size in plan["by_owner"].items() if owner.startswith("weights."))


def greedy_from_ids(llm: LLM, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """Each token-id prompt's ``num_tokens`` greedy tokens (``ignore_eos``), in one batch."""
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [list(t) for t in tokens(outputs)]


def assert_speculation_keeps_greedy_with_rollbacks(
    make_llm: Callable[..., LLM],
    prompts: list[list[int]],
    num_tokens: int,
    speculative_config: SpeculativeConfig,
) -> EngineStats:
    """A model with per-sequence state (``make_llm(**engine_args)``) speculating as
    ``speculative_config`` gives plain decoding's greedy tokens and rolled its state back at
    least once; returns the speculating engine's stats for the caller's own checks."""
    plain = greedy_from_ids(make_llm(), prompts, num_tokens)
    llm = make_llm(speculative_config=speculative_config)
    assert greedy_from_ids(llm, prompts, num_tokens) == plain
    rollback = llm.engine.core.rollback
    assert rollback is not None
    assert rollback.num_rollbacks > 0
    return llm.engine.stats
