"""MTP speculative decoding through the engine on a tiny random DeepSeek-V3 with one MTP layer
(MLA, YaRN, MoE): greedy outputs identical to plain decoding (batched, with prefix-cache hits,
under preemption), every draft block returned, the MTP layer's latent planned and charged to
the draft pool byte for byte, and DeepSeek-V2 or a V3 config without MTP layers refused naming
the flag."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from metrale_model_arch import Tokenizer
from metrale_model_arch.memory import DRAFT_KV_POOL, KV_POOL, MTP
from metrale_server import LLM, EngineArgs, SamplingParams, build_engine
from metrale_server.output.outputs import RequestOutput
from metrale_server.speculative_config import SpeculativeConfig

pytest.importorskip("transformers")

MAX_SEQ_LEN = 256
MAX_BATCH_SIZE = 6
NUM_PROMPTS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
MTP_SPEC = SpeculativeConfig(method="mtp", num_speculative_tokens=3)
MLA = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 512,
}


@pytest.fixture(scope="module")
def v3_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer) -> Path:
    """Two layers (dense, then MoE: 2 groups, 1 kept) and one MTP layer, YaRN."""
    from metrale_testing import save_tiny_deepseek_v3

    path = tmp_path_factory.mktemp("tiny-deepseek-v3-mtp")
    save_tiny_deepseek_v3(
        path,
        **MLA,
        vocab_size=default_tokenizer.vocab_size,
        q_lora_rank=24,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
        num_nextn_predict_layers=1,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        bos_token_id=default_tokenizer.bos_token_id,
        eos_token_id=default_tokenizer.eos_token_id,
        pad_token_id=0,
    )
    default_tokenizer.save(path)
    return path


def prompts(count: int, seed: int) -> list[dict[str, list[int]]]:
    """Random prompts, every other one past the first batch sharing 32 tokens with one of it
    (prefix-cache hits)."""
    rng = random.Random(seed)
    made: list[list[int]] = []
    for index in range(count):
        shares = index >= MAX_BATCH_SIZE and index % 2
        prefix = made[index - MAX_BATCH_SIZE][:32] if shares else []
        made.append(prefix + [rng.randrange(100, 40000) for _ in range(rng.randint(20, 40))])
    return [{"prompt_token_ids": p} for p in made]


def tokens(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [completion.token_ids for output in outputs for completion in output.outputs]


def llm(model: Path, **args: object) -> LLM:
    return LLM(
        str(model),
        dtype="float32",
        max_seq_len=MAX_SEQ_LEN,
        **{"max_batch_size": MAX_BATCH_SIZE, **args},
    )


def test_greedy_is_identical_batched_and_under_preemption(v3_dir: Path) -> None:
    batch = prompts(NUM_PROMPTS, seed=0)
    plain = tokens(llm(v3_dir).generate(batch, GREEDY))
    speculative = llm(v3_dir, speculative_config=MTP_SPEC)
    assert tokens(speculative.generate(batch, GREEDY)) == plain
    engine = speculative.engine
    # A random MTP layer seldom guesses right; it drafts all the same.
    assert engine.stats.num_draft_tokens > NUM_PROMPTS * 10, engine.stats
    assert engine.stats.prefix_cache_hits > 0
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == engine.num_kv_blocks, "every draft block comes back"
    # vLLM's alias, and a pool too small for the batch.
    alias = SpeculativeConfig(method="deepseek_mtp", num_speculative_tokens=2)
    starved = llm(v3_dir, num_kv_blocks=12, speculative_config=alias)
    assert tokens(starved.generate(batch, GREEDY)) == plain
    engine = starved.engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats.num_draft_tokens > 0
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.num_free_blocks == 12


def test_the_mtp_layer_latent_is_planned_and_charged_to_the_draft_pool(v3_dir: Path) -> None:
    engine = build_engine(
        EngineArgs(
            model=str(v3_dir),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=3,
            speculative_config=MTP_SPEC,
        )
    )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    assert MTP in live
    proposer = engine.core.mtp_proposer
    assert proposer is not None
    assert proposer.state is None  # an MLA drafter keeps nothing per sequence
    # One latent row a token: 32 latent + 8 RoPE-key float32 values, one draft block per
    # target block of 16 tokens.
    assert live[DRAFT_KV_POOL] == engine.num_kv_blocks * 16 * (32 + 8) * 4
    assert live[DRAFT_KV_POOL] == proposer.kv_caches.num_bytes
    assert live[KV_POOL] == 2 * live[DRAFT_KV_POOL]  # the target's two layers


def test_deepseek_v2_is_refused_naming_the_flag(tmp_path: Path, v3_dir: Path) -> None:
    """Refused from its config, before any weight is read (the directory holds none)."""
    config = json.loads((v3_dir / "config.json").read_text())
    v2 = {"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
          "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({**config, **v2}))
    for tokenizer_file in v3_dir.glob("tokenizer*"):
        shutil.copy(tokenizer_file, tmp_path)
    with pytest.raises(ValueError, match=r"--speculative-config method mtp: deepseek_v2 .* no MTP"):
        llm(tmp_path, speculative_config=MTP_SPEC)


def test_a_v3_config_without_mtp_layers_is_refused_naming_the_flag(
    tmp_path: Path, v3_dir: Path
) -> None:
    shutil.copytree(v3_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    spec = SpeculativeConfig(method="deepseek_mtp", num_speculative_tokens=1)
    with pytest.raises(ValueError, match=r"--speculative-config method mtp: deepseek_v3 .* no MTP"):
        llm(tmp_path, speculative_config=spec)
