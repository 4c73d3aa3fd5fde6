"""MTP speculative decoding through the engine on a tiny random Qwen3-Next carrying its own MTP
layer (``mtp.*``: gated full attention over the MoE with a gated shared expert, beside Gated
DeltaNet and gated attention layers): greedy outputs identical to plain decoding, batched and
under preemption, whether the drafts are all rejected (a random MTP layer) or mostly kept (one
that drafts as the target nearly decodes), the Gated DeltaNet state rolled back after each
rejection, every draft block returned; the MTP weights and the MTP layer's K/V planned and
charged (``weights.mtp``, ``draft_kv_pool``) byte for byte; a checkpoint or config without the
MTP layer refused naming the flag."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from metrale_testing.engine_parity import assert_ledger_equals_plan
from metrale_testing.qwen3_next_mtp import add_qwen3_next_mtp, save_tiny_qwen3_next
from safetensors.torch import load_file, save_file

from metrale_model_arch import LoadOptions, Tokenizer, load_model
from metrale_model_arch.build import CheckpointError
from metrale_model_arch.memory import DRAFT_KV_POOL, KV_POOL, LINEAR_STATE_POOL, MTP
from metrale_model_arch.owners import SPEC_STATE_SNAPSHOT
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.output.outputs import RequestOutput
from metrale_server.speculative import check_mtp_model
from metrale_server.speculative_config import SpeculativeConfig

pytest.importorskip("transformers")

MAX_SEQ_LEN = 128
MAX_BATCH_SIZE = 4
NUM_PROMPTS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
MTP_SPEC = SpeculativeConfig(method="mtp", num_speculative_tokens=3)
# Two Gated DeltaNet layers around one gated attention layer; layer 2 dense. The MTP layer is
# shaped as layer 1 (full attention, sparse), as MTP layer 0 is.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.25,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 12,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "mlp_only_layers": [2],
    "max_position_embeddings": 256,
    "pad_token_id": None,
}


def save(path: Path, tokenizer: Tokenizer, *, with_mtp: bool) -> Path:
    save_tiny_qwen3_next(
        path,
        vocab_size=tokenizer.vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **TINY,
    )
    if with_mtp:
        add_qwen3_next_mtp(path, torch.Generator().manual_seed(1), source_layer=1)
    tokenizer.save(path)
    return path


# The stack's residual writes: attention and Gated DeltaNet outputs, the experts' and MLPs'.
_STACK_WRITES = re.compile(
    r"model\.layers\.\d+\.(?:self_attn\.o_proj|linear_attn\.out_proj|mlp\.experts\.\d+\.down_proj"
    r"|mlp\.shared_expert\.down_proj|mlp\.down_proj)\.weight"
)
_MTP_BLOCK_WRITES = re.compile(
    r"mtp\.layers\.0\.(?:self_attn\.o_proj|mlp\.experts\.\d+\.down_proj"
    r"|mlp\.shared_expert\.down_proj)\.weight"
)
# The stack's writes scaled by this: the target's next token is nearly a function of its
# current token (so the drafter below guesses right about half the time), and still turns on
# the Gated DeltaNet state (restoring no checkpoint after a rejection changes the output).
STACK_SCALE = 0.005


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    return save(tmp_path_factory.mktemp("tiny-qwen3-next-mtp"), default_tokenizer, with_mtp=True)


@pytest.fixture(scope="module")
def accepting_dir(tmp_path_factory: pytest.TempPathFactory, mtp_dir: Path) -> Path:
    """``mtp_dir`` with the stack's residual writes scaled by :data:`STACK_SCALE` and an MTP
    layer that drafts the target's next token as if the stack wrote nothing: ``fc`` passes the
    next token's normed embedding through (``[I | 0]``), the block writes nothing, ``mtp.norm``
    is the final norm, so ``h'`` is the target's final hidden state over that token alone."""
    path = tmp_path_factory.mktemp("tiny-qwen3-next-accepting") / "model"
    shutil.copytree(mtp_dir, path)
    tensors = load_file(path / "model.safetensors")
    hidden = tensors["model.norm.weight"].shape[0]
    for name, tensor in tensors.items():
        if _STACK_WRITES.fullmatch(name):
            tensors[name] = STACK_SCALE * tensor
        elif _MTP_BLOCK_WRITES.fullmatch(name):
            tensors[name] = torch.zeros_like(tensor)
    tensors["mtp.fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1)
    tensors["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(hidden)
    tensors["mtp.norm.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def prompts(count: int, seed: int) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    made = [[rng.randrange(100, 40000) for _ in range(rng.randint(3, 40))] for _ in range(count)]
    return [{"prompt_token_ids": p} for p in made]


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [completion.token_ids for output in outputs for completion in output.outputs]


def llm(model: Path, **args: object) -> LLM:
    return LLM(
        str(model),
        dtype="float32",
        device="cpu",
        max_seq_len=MAX_SEQ_LEN,
        **{"max_batch_size": MAX_BATCH_SIZE, **args},
    )


@pytest.mark.parametrize("drafts", ["rejected", "kept"])
def test_greedy_is_identical_batched_and_under_preemption(
    mtp_dir: Path, accepting_dir: Path, drafts: str
) -> None:
    path = mtp_dir if drafts == "rejected" else accepting_dir
    batch = prompts(NUM_PROMPTS, seed=0)
    plain = tokens(llm(path).generate(batch, GREEDY))
    speculative = llm(path, speculative_config=MTP_SPEC)
    assert tokens(speculative.generate(batch, GREEDY)) == plain
    engine = speculative.engine
    assert not engine.core.prefix_caching  # off over per-sequence state
    stats = engine.stats
    assert stats.num_draft_tokens > NUM_PROMPTS * 5, stats
    if drafts == "rejected":
        # A random MTP layer seldom guesses right; it drafts all the same.
        assert stats.num_accepted_tokens < stats.num_draft_tokens // 10, stats
    else:
        # Kept at every draft position, and rejected often enough to roll back.
        assert all(kept > 0 for kept in stats.num_accepted_by_position), stats
        assert stats.num_draft_tokens // 4 < stats.num_accepted_tokens < stats.num_draft_tokens
    rollback = engine.core.rollback
    assert rollback is not None
    assert rollback.num_rollbacks > 0
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.state is None  # a gated-attention drafter keeps nothing per sequence
    assert proposer.num_free_blocks == engine.num_kv_blocks, "every draft block comes back"
    # A pool too small for the batch: sequences are preempted and resumed.
    starved = llm(path, num_kv_blocks=8, speculative_config=MTP_SPEC)
    assert tokens(starved.generate(batch, GREEDY)) == plain
    engine = starved.engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats.num_draft_tokens > 0
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == 8


def test_the_mtp_weights_and_draft_pool_are_planned_and_charged(mtp_dir: Path) -> None:
    # Every saved tensor at 4 bytes by owner, the checkpoint's mtp.* as weights.mtp.
    engine = assert_ledger_equals_plan(
        mtp_dir, "float32", max_seq_len=MAX_SEQ_LEN, float32_names="<none>", mtp_prefix="mtp."
    )
    live = engine.ledger.live_bytes_by_owner()
    assert MTP in live
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    # One layer, K and V of two heads of 16 float32 values, one draft block per target block
    # of 16 tokens; the target's one gated attention layer pages as much.
    assert live[DRAFT_KV_POOL] == engine.num_kv_blocks * 16 * (2 * 2 * 16 * 4)
    assert live[DRAFT_KV_POOL] == proposer.kv_caches.num_bytes
    assert live[KV_POOL] == live[DRAFT_KV_POOL]
    # The Gated DeltaNet state of each slot, and its checkpoint before a verify step.
    assert live[LINEAR_STATE_POOL] > 0
    assert live[SPEC_STATE_SNAPSHOT] > 0
    plain = build_engine(
        EngineArgs(
            model=str(mtp_dir),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=2,
        )
    )
    plain_live = plain.ledger.live_bytes_by_owner()
    assert plain_live == plain.plan.allocated_by_owner()
    assert MTP not in plain_live, (
        "without MTP speculation the MTP layer is neither planned nor loaded"
    )
    assert DRAFT_KV_POOL not in plain_live
    assert plain.loaded.model.num_mtp_layers == 0


def test_a_model_loaded_without_its_mtp_layer_is_refused_naming_the_flag(mtp_dir: Path) -> None:
    loaded = load_model(str(mtp_dir), LoadOptions(device="cpu", without_mtp=True))
    assert loaded.model.num_mtp_layers == 0
    with pytest.raises(ValueError, match=r"--speculative-config method mtp: qwen3_next .* no MTP"):
        check_mtp_model(loaded)


def test_a_config_without_mtp_layers_is_refused_naming_the_flag(
    tmp_path: Path, mtp_dir: Path
) -> None:
    shutil.copytree(mtp_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(ValueError, match=r"--speculative-config method mtp: qwen3_next .* no MTP"):
        llm(tmp_path, speculative_config=MTP_SPEC)


def test_a_checkpoint_without_mtp_weights_is_refused_naming_them(
    tmp_path: Path, default_tokenizer: Tokenizer
) -> None:
    """transformers' save drops ``mtp.*`` (config.json still implies one MTP layer): plain
    decoding serves it; method mtp names the missing MTP tensors and how to serve without."""
    path = save(tmp_path, default_tokenizer, with_mtp=False)
    assert len(tokens(llm(path).generate(prompts(1, seed=1), GREEDY))[0]) == 16
    with pytest.raises(CheckpointError, match=r"model\.mtp_layers\.0\..*num_nextn_predict_layers"):
        llm(path, speculative_config=MTP_SPEC)
