"""build_engine: the one way to an engine; the parts it hands the core, and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_model_arch import ChatTemplate, LoadOptions, load_model
from metrale_server import EngineArgs, build_engine
from metrale_server.engine.rank_setup import load_options, plan_engine, resolve_target
from metrale_server.memory.ledger import MemoryLedger


def test_the_chat_template_replaces_the_models_own_before_the_core_sees_it(
    tiny_model_dir: Path,
) -> None:
    template = ChatTemplate(source="{{ messages[0]['content'] }}!", origin="flag")
    engine = build_engine(
        EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=2),
        chat_template=template,
    )
    assert engine.loaded.chat_template.origin == "flag"
    assert engine.loaded.render_chat([{"role": "user", "content": "hi"}]) == "hi!"
    special = engine.loaded.chat_template.special_tokens
    assert special == engine.loaded.tokenizer.special_tokens_map


def test_the_engine_loads_what_the_plan_says_through_its_ledger(tiny_model_dir: Path) -> None:
    args = EngineArgs(model=str(tiny_model_dir), dtype="float32", max_batch_size=2)
    target = resolve_target(args)
    plan = plan_engine(args, target)
    engine = build_engine(args, plan=plan)
    assert engine.plan is plan
    assert engine.max_seq_len == plan.inputs.max_seq_len
    assert engine.ledger.live_bytes_by_owner() == plan.allocated_by_owner()
    options = load_options(args, plan, target, MemoryLedger())
    assert options.max_seq_len == plan.inputs.max_seq_len
    assert options.quantization == plan.inputs.quantization


def test_a_loaded_model_is_planned_for_and_charged_to_a_new_ledger(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), LoadOptions(max_seq_len=64))
    engine = build_engine(EngineArgs(max_batch_size=2), loaded)
    assert engine.loaded is loaded
    assert engine.max_seq_len == 64
    assert engine.ledger.live_bytes_by_owner() == engine.plan.allocated_by_owner()


def test_a_loaded_model_cannot_be_split_over_ranks(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), LoadOptions(max_seq_len=64))
    with pytest.raises(ValueError, match="loads each rank's shard itself"):
        build_engine(EngineArgs(tensor_parallel_size=2), loaded)
