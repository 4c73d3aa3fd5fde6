"""MTP speculation on GLM-5.3 (the indexer paged or flat): greedy text identical to plain
decoding under preemption; after every step the drafter's own indexer (the proposer's
per-sequence state) equals one run of the MTP layer over the sequence's tokens and the target's
hidden states at the positions it cached, so it folded each token once and no draft; the
proposer's state planned and charged under ``proposer_state`` as seed 003 prices it."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from metrale_testing import add_glm5_mtp_layer
from safetensors.torch import load_file, save_file

from metrale_kernels import build_attention_metadata
from metrale_model_arch.cache_spec import dsa_capacity
from metrale_model_arch.families.glm5_next import Glm5NextForCausalLM
from metrale_model_arch.kv_cache import allocate_layer_cache
from metrale_model_arch.memory import mtp_cache_spec
from metrale_model_arch.owners import DRAFT_KV_POOL, PER_SEQUENCE_STATE, PROPOSER_STATE
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.memory.preflight import plan_log_lines
from metrale_server.memory.report import memory_report
from metrale_server.speculative.mtp import MtpProposer
from metrale_server.speculative_config import SpeculativeConfig

FLAT_LEVER = "METRALE_GLM_DSA_INDEXER_FLAT"
MAX_SEQ_LEN = 256
NUM_KV_BLOCKS = 12  # too few for every sequence at once: the engine preempts
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
MTP = SpeculativeConfig(method="mtp", num_speculative_tokens=3)
# The MTP layer's indexer after the same rows at once against chunk by chunk differs by float32
# matmuls over other shapes: up to 2.1e-6 (1.9e-5 relative) measured; a token folded twice, or a
# draft left folded, moves a running softmax by its whole weight.
STATE_TOLERANCE = 1e-4
Key = tuple[str, int]


@pytest.fixture(scope="module")
def glm5_mtp_dir(tiny_glm5_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GLM-5.3 with a random MTP layer (a DSA layer with its own indexer), text only
    (the engine serves the text model)."""
    path = tmp_path_factory.mktemp("tiny-glm5-mtp") / "model"
    shutil.copytree(tiny_glm5_dir, path)
    config = json.loads((path / "config.json").read_text())
    del config["vision_config"]
    (path / "config.json").write_text(json.dumps(config))
    tensors = load_file(path / "model.safetensors")
    text = {name: tensor for name, tensor in tensors.items() if ".visual." not in name}
    save_file(text, path / "model.safetensors", metadata={"format": "pt"})
    add_glm5_mtp_layer(path, torch.Generator().manual_seed(7), source_layer=1)
    return path


@pytest.fixture(scope="module", params=[False, True], ids=["paged", "flat"])
def flat(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def prompts(count: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(100, 49152) for _ in range(rng.randint(3, 40))] for _ in range(count)]


def glm(path: Path, flat: bool, **args: Any) -> LLM:
    with pytest.MonkeyPatch.context() as patch:
        if flat:
            patch.setenv(FLAT_LEVER, "1")
        return LLM(
            str(path), dtype="float32", device="cpu", max_seq_len=MAX_SEQ_LEN, max_batch_size=6,
            num_kv_blocks=NUM_KV_BLOCKS, **args,
        )  # fmt: skip


class HiddenLog:
    """Wraps ``observe``: the target's hidden state at each (request, position) it was given,
    the first time (a rolled-back step runs positions again)."""

    def __init__(self, proposer: MtpProposer) -> None:
        self.rows: dict[Key, torch.Tensor] = {}
        observe = proposer.observe

        def logged(chunks: Any, hidden: torch.Tensor, room: Callable[[Any], int]) -> None:
            offset = 0
            for chunk in chunks:
                for seq in chunk.samplers or (chunk.seq,):
                    for i in range(chunk.num_new_tokens):
                        if chunk.start + i < seq.num_tokens - 1:
                            key = (seq.request_id, chunk.start + i)
                            self.rows.setdefault(key, hidden[offset + i].clone())
                offset += chunk.num_new_tokens
            observe(chunks, hidden, room)

        proposer.observe = logged  # type: ignore[method-assign]


def reference_indexer(
    proposer: MtpProposer, tokens: list[int], hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MTP layer once over ``tokens`` (each after the position of its ``hidden`` row) from
    a fresh cache and indexer: that indexer's keys and flags."""
    model = proposer.model
    assert isinstance(model, Glm5NextForCausalLM)
    assert proposer.state is not None
    keys, flags = (torch.zeros_like(t[:1]) for t in proposer.state.indexer)
    num_blocks = -(-len(tokens) // proposer.blocks.block_size)
    cache = allocate_layer_cache(
        mtp_cache_spec(model.config), num_blocks=num_blocks, block_size=proposer.blocks.block_size,
        dtype=torch.float32, device="cpu", owner="test",
    )  # fmt: skip
    metadata = build_attention_metadata(
        block_tables=[list(range(num_blocks))], seq_lens=[len(tokens)],
        query_lens=[len(tokens)], block_size=proposer.blocks.block_size, state_slots=[0],
    )  # fmt: skip
    with torch.inference_mode():
        model.forward_mtp(
            torch.tensor(tokens), hidden, torch.arange(len(tokens)), cache[0], metadata,
            (keys, flags),
        )  # fmt: skip
    return keys[0], flags[0]


def live_rows(num_cached: int, kpool: int) -> torch.Tensor:
    """The rows the next step reads: each complete pool's key, the filling pool's running
    softmax (its first three rows, ``index_kpool`` 4)."""
    done = num_cached - num_cached % kpool
    complete = list(range(0, done, kpool))
    filling = list(range(done, done + min(kpool, 3))) if num_cached % kpool else []
    return torch.tensor(complete + filling, dtype=torch.int64)


def check_proposer_state(llm: LLM, log: HiddenLog) -> int:
    """Each running sequence's drafter indexer against :func:`reference_indexer` over the
    positions its cache holds; how many were compared."""
    core = llm.engine.core
    proposer = core.mtp_proposer
    assert proposer is not None
    assert proposer.state is not None
    keys, flags = proposer.state.indexer
    kpool = proposer.kpool
    num_checked = 0
    for group in core.scheduler.running:
        for seq in group.seqs:
            cache = proposer.blocks.find(seq)
            if cache is None or cache.end == cache.start or seq.is_finished:
                continue
            assert seq.slot is not None
            positions = range(cache.start, cache.end)
            hidden = torch.stack([log.rows[seq.request_id, p] for p in positions])
            tokens = seq.token_ids[cache.start + 1 : cache.end + 1]
            want_keys, want_flags = reference_indexer(proposer, tokens, hidden)
            rows = live_rows(len(tokens), kpool)
            got = keys[seq.slot, rows]
            torch.testing.assert_close(
                got, want_keys[rows], rtol=STATE_TOLERANCE, atol=STATE_TOLERANCE
            )
            complete = rows[rows < len(tokens) - len(tokens) % kpool]
            assert torch.equal(flags[seq.slot, complete], want_flags[complete])
            assert flags[seq.slot, complete].all()
            num_checked += 1
    return num_checked


def generate(llm: LLM, batch: list[list[int]], *, check: bool) -> list[tuple[int, ...]]:
    engine = llm.engine
    log = None
    if check:
        assert engine.core.mtp_proposer is not None
        log = HiddenLog(engine.core.mtp_proposer)
    for index, prompt in enumerate(batch):
        engine.add_request(f"p{index}", prompt, GREEDY)
    outputs: dict[str, tuple[int, ...]] = {}
    num_checked = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] = tuple(output.outputs[0].token_ids)
        if log is not None:
            num_checked += check_proposer_state(llm, log)
    if check:
        assert num_checked > 50
    return [outputs[f"p{index}"] for index in range(len(batch))]


def test_mtp_greedy_text_and_the_drafters_state_under_preemption(
    glm5_mtp_dir: Path, flat: bool
) -> None:
    batch = prompts(20)
    plain = generate(glm(glm5_mtp_dir, flat), batch, check=False)
    llm = glm(glm5_mtp_dir, flat, speculative_config=MTP)
    assert generate(llm, batch, check=True) == plain
    stats = llm.engine.stats
    assert stats.num_preemptions > 0
    assert stats.num_draft_tokens > 200, stats
    rollback = llm.engine.core.rollback
    assert rollback is not None
    assert rollback.num_rollbacks > 0
    assert llm.engine.block_manager.num_free_blocks == NUM_KV_BLOCKS
    proposer = llm.engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == NUM_KV_BLOCKS


def test_the_proposer_state_is_planned_and_charged(glm5_mtp_dir: Path, flat: bool) -> None:
    with pytest.MonkeyPatch.context() as patch:
        if flat:
            patch.setenv(FLAT_LEVER, "1")
        args = EngineArgs(
            model=str(glm5_mtp_dir), dtype="float32", device="cpu", max_seq_len=MAX_SEQ_LEN,
            max_batch_size=3, speculative_config=MTP,
        )  # fmt: skip
        engine = build_engine(args)
        plain = build_engine(attrs.evolve(args, speculative_config=None))
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    # Seed 003 per sequence: the drafter's flat indexer (256 positions, pools of 4, of 16
    # float32 keys and a flag byte), concat 2 x 64 bf16, x 64 bf16, logits 49152 bf16,
    # arg 4 B, head_xchg 16 B; times 3 sequences.
    assert dsa_capacity(MAX_SEQ_LEN, 4) == 256
    proposer = 256 * (16 * 4 + 1) + 2 * 64 * 2 + 64 * 2 + 49152 * 2 + 4 + 16
    assert live[PROPOSER_STATE] == 3 * proposer == 346_044
    assert engine.plan.per_sequence.proposer == proposer
    # The target's own DSA layers (two full indexers): flat per sequence, or paged.
    target = 2 * 256 * (16 * 4 + 1) if flat else 0
    assert live.get(PER_SEQUENCE_STATE, 0) == 3 * target
    assert engine.plan.per_sequence_reserve_bytes == 3 * (target + proposer)
    line = next(
        line
        for line in plan_log_lines(engine.plan, engine.loaded.config)
        if line.startswith("Per-sequence state reserve")
    )
    mib = 2**20
    assert line.startswith(
        f"Per-sequence state reserve: {3 * (target + proposer) / mib:.1f} MiB = 3 seq x "
        f"({target / mib:.1f} MiB target DSA layers + {proposer / mib:.1f} MiB proposer)"
    )
    # The MTP layer's K/V pool, said beside it (none without speculation).
    pool_line = f"MTP draft pool: {live[DRAFT_KV_POOL] / mib:.1f} MiB = {engine.plan.kv_blocks} "
    assert any(
        line.startswith(pool_line) for line in plan_log_lines(engine.plan, engine.loaded.config)
    )
    plain_lines = plan_log_lines(plain.plan, plain.loaded.config)
    assert not any(line.startswith("MTP draft pool") for line in plain_lines)
    report = memory_report(engine.plan, engine.ledger, engine.loaded.device)
    assert report.plan_by_owner[PROPOSER_STATE] == report.ledger_by_owner[PROPOSER_STATE]
    # Speculation off: no proposer state, planned or allocated.
    assert PROPOSER_STATE not in plain.ledger.live_bytes_by_owner()
    assert plain.plan.per_sequence.proposer == 0
