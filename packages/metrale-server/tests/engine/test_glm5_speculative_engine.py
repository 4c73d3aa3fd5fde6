"""Speculation on GLM-5.3 (KDA linear attention and DSA layers, the indexer paged or flat):
after every step each running sequence's KDA recurrent and conv state and its indexer's live
rows (every complete pool's key, the filling pool's running softmax) equal plain decoding's
after as many tokens, to 1e-6 served in float64, whether the draft is kept (the target as its
own draft model) or mostly rejected (a random draft model) or found by n-gram lookup; greedy
text identical, also under preemption; the checkpoints planned and charged byte for byte, at
float32 and at float64."""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest
import torch

from metrale_config import LINEAR_ATTENTION
from metrale_model_arch.memory import draft_model_bytes
from metrale_model_arch.owners import DRAFT_MODEL, SPEC_STATE_SNAPSHOT
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.engine.core import EngineCore
from metrale_server.engine.sequence import Sequence
from metrale_server.memory.preflight import plan_engine_memory
from metrale_server.speculative_config import SpeculativeConfig

FLAT_LEVER = "METRALE_GLM_DSA_INDEXER_FLAT"
MAX_SEQ_LEN = 256
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
# The largest difference from plain decoding's state (relative, values of at least 1). In
# float32 plain decoding's own state moves with the batch: 1.3e-5 at one sequence a step against
# eight, 1.4e-5 with prefill chunks of 5 (matmuls of other shapes, KDA's chunked form against
# its one-token form); speculation 1.7e-5. In float64 (the torch kernels) speculation stays
# within 3e-14, so the 1e-6 leaves no room for a wrong rollback (0.01 and more).
TOLERANCE = {"float32": 5e-5, "float64": 1e-6}
NUM_PROMPTS = 10
# A random model seldom repeats itself: these prompts are ones where n-gram lookup drafts.
PROMPT_SEED = 2
StateLog = dict[tuple[str, int], list[torch.Tensor]]
Outputs = list[tuple[int, ...]]


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Random prompts, each a short phrase repeated (so n-gram lookup finds drafts)."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        phrase = [rng.randrange(100, 49152) for _ in range(rng.randint(2, 9))]
        made.append((phrase * 8)[: rng.randint(5, 50)])
    return made


def live_state(core: EngineCore, seq: Sequence) -> list[torch.Tensor]:
    """What the sequence's next tokens read of its state: each KDA layer's recurrent and conv
    state, each DSA layer's pooled keys of complete pools and running rows of the filling one
    (with their flags, flat)."""
    runner, config = core.runner, core.loaded.config
    assert config.dsa is not None
    assert seq.slot is not None
    kpool, done = config.dsa.index_kpool, seq.num_computed_tokens
    complete = list(range(0, done - done % kpool, kpool))
    filling = list(range(done - done % kpool, done - done % kpool + min(kpool, 3)))
    rows = torch.tensor(complete + (filling if done % kpool else []), dtype=torch.int64)
    state: list[torch.Tensor] = []
    for layer, kind in enumerate(config.layer_types):
        if kind == LINEAR_ATTENTION:
            state += [tensor[seq.slot].clone() for tensor in runner.seq_states[layer]]
        elif config.dsa.indexer_types[layer] != "full":
            continue  # a shared layer reads the full layer's selection: its rows stay unused
        elif runner.seq_states[layer]:
            keys, flags = runner.seq_states[layer]
            state += [keys[seq.slot, rows].clone(), flags[seq.slot, complete].float()]
        else:
            keys = runner.kv_caches[layer][1]
            table = torch.tensor(seq.block_table, dtype=torch.int64)
            size = keys.shape[1]
            state.append(keys.view(-1, keys.shape[-1])[table[rows // size] * size + rows % size])
    return state


def running(core: EngineCore) -> list[Sequence]:
    return [
        seq
        for group in core.scheduler.running
        for seq in group.seqs
        if seq.slot is not None and not seq.is_finished and seq.num_computed_tokens
    ]


def generate(llm: LLM, batch: list[list[int]]) -> tuple[Outputs, StateLog, int]:
    """Greedy outputs, each running sequence's live state after each step by (request,
    computed tokens), and how many times a step rolled a sequence back: it gained tokens but
    not computed ones, and its state is then exactly the one before the step."""
    engine, core = llm.engine, llm.engine.core
    for index, prompt in enumerate(batch):
        engine.add_request(f"p{index}", prompt, GREEDY)
    outputs: dict[str, tuple[int, ...]] = {}
    log: StateLog = {}
    num_rolled_back = 0
    while engine.has_unfinished_requests():
        before = {s.seq_id: (s.num_tokens, s.num_computed_tokens) for s in running(core)}
        for output in engine.step():
            outputs[output.request_id] = tuple(output.outputs[0].token_ids)
        for seq in running(core):
            key = seq.request_id, seq.num_computed_tokens
            state = live_state(core, seq)
            num_tokens, num_computed = before.get(seq.seq_id, (0, 0))
            if num_tokens < seq.num_tokens and num_computed == seq.num_computed_tokens:
                num_rolled_back += 1
                for got, saved in zip(state, log[key], strict=True):
                    assert torch.equal(got, saved), key
            log[key] = state
    return [outputs[f"p{index}"] for index in range(len(batch))], log, num_rolled_back


def kernel_backend(dtype: str) -> str:
    """float64 runs on the torch kernels only; float32 on what ``auto`` picks."""
    return "torch" if dtype == "float64" else "auto"


def glm(path: Path, dtype: str, **args: object) -> LLM:
    return LLM(
        str(path), dtype=dtype, kernel_backend=kernel_backend(dtype), device="cpu",
        max_seq_len=MAX_SEQ_LEN, max_batch_size=8, **args,
    )  # fmt: skip


def worst_error(plain: StateLog, speculative: StateLog) -> float:
    """The largest difference from plain decoding's state after as many tokens, relative to
    the value (at least 1)."""
    assert len(speculative) >= 40
    worst = 0.0
    for key, state in speculative.items():
        expected = plain[key]  # plain decoding passes every length
        for got, want in zip(state, expected, strict=True):
            error = ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()
            worst = max(worst, error)
    return worst


@pytest.fixture(scope="module", params=[False, True], ids=["paged", "flat"])
def flat(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(scope="module", params=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def plain(tiny_glm5_dir: Path, flat: bool, dtype: str) -> tuple[Outputs, StateLog]:
    with pytest.MonkeyPatch.context() as patch:
        if flat:
            patch.setenv(FLAT_LEVER, "1")
        llm = glm(tiny_glm5_dir, dtype)
        outputs, log, _ = generate(llm, prompts(NUM_PROMPTS, PROMPT_SEED))
        return outputs, log


def speculating(path: Path, flat: bool, dtype: str, spec: SpeculativeConfig, **args: object) -> LLM:
    with pytest.MonkeyPatch.context() as patch:
        if flat:
            patch.setenv(FLAT_LEVER, "1")
        return glm(path, dtype, speculative_config=spec, **args)


def test_the_target_as_its_own_draft_keeps_drafts_and_the_state(
    tiny_glm5_dir: Path, flat: bool, dtype: str, plain: tuple[Outputs, StateLog]
) -> None:
    spec = SpeculativeConfig(
        method="draft_model", model=str(tiny_glm5_dir), num_speculative_tokens=3
    )
    llm = speculating(tiny_glm5_dir, flat, dtype, spec)
    outputs, log, _ = generate(llm, prompts(NUM_PROMPTS, PROMPT_SEED))
    assert outputs == plain[0]
    stats = llm.engine.stats
    assert stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens > 100, stats
    assert worst_error(plain[1], log) <= TOLERANCE[dtype]


def test_a_random_draft_is_mostly_rejected_and_rolled_back(
    tiny_glm5_dir: Path,
    tiny_model_dir: Path,
    flat: bool,
    dtype: str,
    plain: tuple[Outputs, StateLog],
) -> None:
    spec = SpeculativeConfig(
        method="draft_model", model=str(tiny_model_dir), num_speculative_tokens=3
    )
    llm = speculating(tiny_glm5_dir, flat, dtype, spec, num_kv_blocks=12)
    outputs, log, num_rolled_back = generate(llm, prompts(NUM_PROMPTS, PROMPT_SEED))
    assert outputs == plain[0]
    stats = llm.engine.stats
    assert stats.num_preemptions > 0
    assert stats.num_accepted_tokens < 0.2 * stats.num_draft_tokens, stats
    rollback = llm.engine.core.rollback
    assert rollback is not None
    assert num_rolled_back > 50  # each restored exactly to its state before the step
    assert rollback.num_rollbacks >= num_rolled_back
    assert worst_error(plain[1], log) <= TOLERANCE[dtype]
    assert llm.engine.block_manager.num_free_blocks == 12


def test_ngram_under_preemption_keeps_greedy_text(
    tiny_glm5_dir: Path, flat: bool, dtype: str, plain: tuple[Outputs, StateLog]
) -> None:
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    llm = speculating(tiny_glm5_dir, flat, dtype, spec, num_kv_blocks=12)
    outputs, log, num_rolled_back = generate(llm, prompts(NUM_PROMPTS, PROMPT_SEED))
    assert outputs == plain[0]
    stats = llm.engine.stats
    assert stats.num_preemptions > 0
    assert stats.num_draft_tokens > 0, stats
    assert num_rolled_back > 0
    assert worst_error(plain[1], log) <= TOLERANCE[dtype]
    assert llm.engine.block_manager.num_free_blocks == 12


def test_the_checkpoints_are_planned_and_charged(
    tiny_glm5_dir: Path, flat: bool, dtype: str
) -> None:
    spec = SpeculativeConfig(
        method="draft_model", model=str(tiny_glm5_dir), num_speculative_tokens=2
    )
    with pytest.MonkeyPatch.context() as patch:
        if flat:
            patch.setenv(FLAT_LEVER, "1")
        args = EngineArgs(
            model=str(tiny_glm5_dir), dtype=dtype, kernel_backend=kernel_backend(dtype),
            device="cpu", max_seq_len=MAX_SEQ_LEN, max_batch_size=3, speculative_config=spec,
        )  # fmt: skip
        engine = build_engine(args)
        off = plan_engine_memory(
            attrs.evolve(args, speculative_config=None),
            engine.loaded.config,
            device=engine.loaded.device,
            dtype=engine.loaded.dtype,
        )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    # Per slot: two KDA layers' state (2 heads x 16 x 16, and 3 conv inputs of 3 x 2 x 16
    # channels) and two DSA layers' pool of 4 rows of 16 keys (and flags), float32 or float64.
    size = 8 if dtype == "float64" else 4
    kda = 2 * (2 * 16 * 16 + 3 * 2 * 16 * 3) * size
    indexer = 2 * 4 * (16 * size + (1 if flat else 0))
    assert live[SPEC_STATE_SNAPSHOT] == 3 * (kda + indexer)
    # The draft (the same model) keeps its own KDA state (and a dummy slot) and checkpoints,
    # its indexer paged in the draft pool; the rest of draft_model is its weights and table.
    draft_state = 4 * kda + 3 * (kda + 2 * 4 * 16 * size)
    proposer = engine.core.draft_proposer
    assert proposer is not None
    checkpoints = proposer.checkpoints
    held = [*proposer.states.allocations, *(saved for _, saved in checkpoints.linear)]
    held += [checkpoints.saved_keys] if checkpoints.saved_keys is not None else []
    assert sum(t.numel() * t.element_size() for t in held) == draft_state
    draft = engine.plan.inputs.draft
    assert draft is not None
    weights = draft_model_bytes(draft, size, MAX_SEQ_LEN)
    assert live[DRAFT_MODEL] == engine.plan.draft_model_bytes == weights + draft_state
    assert SPEC_STATE_SNAPSHOT not in off.allocated_by_owner()
