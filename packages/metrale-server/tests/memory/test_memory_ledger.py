"""The allocation ledger: its unit behaviour, and plan == ledger on a tiny model of every family.

After an ``Engine`` is built, the ledger's live bytes by owner must equal the plan's allocated
owners exactly; the plan's weight and KV numbers are also checked against the Hugging Face
model's own parameters and a hand-computed KV price, so a mistake shared by plan and loader
still shows.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from metrale_config import model_config_from_hf_file
from metrale_model_arch import LoadOptions, Tokenizer, load_model
from metrale_model_arch.memory import BUFFER_ARENA, KV_POOL, ROPE_TABLE, RUNTIME_HEADROOM
from metrale_server import EngineArgs, build_engine
from metrale_server.memory.ledger import MemoryLedger

CPU = torch.device("cpu")
EMBEDDINGS = "weights.embeddings"
LAYERS = "weights.layers"
FINAL_NORM = "weights.final_norm"
LM_HEAD = "weights.lm_head"
HIDDEN = 64
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN // NUM_HEADS
MAX_SEQ_LEN = 64
BLOCK_SIZE = 16
MAX_BATCH_SIZE = 2
MAX_BATCH_TOKENS = 128

# name -> (transformers config class, model class, extra config fields, expected parse)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "llama-tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"tie_word_embeddings": True},
        {"model_type": "llama", "tie_word_embeddings": True},
    ),
    "llama-untied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"tie_word_embeddings": False},
        {"model_type": "llama", "tie_word_embeddings": False},
    ),
    "mistral-sliding-window": (
        "MistralConfig",
        "MistralForCausalLM",
        {"sliding_window": 32, "tie_word_embeddings": False},
        {"model_type": "mistral", "sliding_window": 32},
    ),
    "qwen2-qkv-bias": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"tie_word_embeddings": False},
        {"model_type": "qwen2", "qkv_bias": True},
    ),
    "qwen3-qk-norm": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"head_dim": HEAD_DIM, "tie_word_embeddings": True},
        {"model_type": "qwen3", "qk_norm": True, "tie_word_embeddings": True},
    ),
}


def save_family(path: Path, family: str, tokenizer: Tokenizer) -> dict[str, int]:
    """Save a tiny random model of ``family``; returns its weight bytes by owner at float32,
    read off the Hugging Face model's own parameters (tied weights once)."""
    transformers = pytest.importorskip("transformers")
    config_name, model_name, extra, _ = FAMILIES[family]
    config = getattr(transformers, config_name)(
        vocab_size=tokenizer.vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)
    owners = {EMBEDDINGS: 0, LAYERS: 0, FINAL_NORM: 0, LM_HEAD: 0}
    for name, param in model.named_parameters():  # a tied head is listed once, as embed_tokens
        if name.startswith("lm_head."):
            owners[LM_HEAD] += param.numel()
        elif name.startswith("model.embed_tokens."):
            owners[EMBEDDINGS] += param.numel()
        elif name.startswith("model.norm."):
            owners[FINAL_NORM] += param.numel()
        else:
            owners[LAYERS] += param.numel()
    return {owner: count * 4 for owner, count in owners.items()}


@pytest.fixture(scope="module")
def family_dirs(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> dict[str, tuple[Path, dict[str, int]]]:
    saved = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        saved[family] = (path, save_family(path, family, default_tokenizer))
    return saved


# --- the ledger on its own ------------------------------------------------------------------


def test_allocate_charges_the_owner_the_tensor_bytes() -> None:
    ledger = MemoryLedger()
    kv = ledger.allocate("kv_pool", (4, 16, 8), torch.float32, CPU)
    ids = ledger.allocate("buffer_arena", (10,), torch.int64, CPU)
    ledger.allocate("buffer_arena", (3, 5), torch.bfloat16, CPU)
    assert kv.shape == (4, 16, 8)
    assert kv.dtype == torch.float32
    assert kv.device == CPU
    assert ids.shape == (10,)
    assert ids.dtype == torch.int64
    assert ledger.live_bytes_by_owner() == {"kv_pool": 4 * 16 * 8 * 4, "buffer_arena": 80 + 30}
    assert ledger.live_bytes() == 2048 + 110


def test_an_empty_ledger_and_zero_byte_owners_report_nothing() -> None:
    ledger = MemoryLedger()
    assert ledger.live_bytes() == 0
    assert ledger.live_bytes_by_owner() == {}
    ledger.allocate("empty", (0, 7), torch.float32, CPU)
    assert ledger.live_bytes_by_owner() == {}
    assert ledger.live_bytes() == 0


def test_release_drops_one_owner_and_returns_its_bytes() -> None:
    ledger = MemoryLedger()
    ledger.allocate("kv_pool", (100,), torch.float32, CPU)
    ledger.allocate("kv_pool", (50,), torch.float32, CPU)
    ledger.allocate("buffer_arena", (8,), torch.int64, CPU)
    assert ledger.release("kv_pool") == 600
    assert ledger.live_bytes_by_owner() == {"buffer_arena": 64}
    assert ledger.release("kv_pool") == 0
    assert ledger.release("never-allocated") == 0
    assert ledger.live_bytes() == 64


def test_adopt_charges_a_foreign_tensor_once() -> None:
    ledger = MemoryLedger()
    weight = torch.zeros(6, 10)
    ledger.adopt(LAYERS, weight)
    ledger.adopt(LAYERS, weight)
    assert ledger.live_bytes_by_owner() == {LAYERS: 240}


def test_adopting_views_of_a_charged_storage_adds_nothing() -> None:
    ledger = MemoryLedger()
    pool = ledger.allocate(KV_POOL, (2, 4, 8), torch.float32, CPU)
    ledger.adopt(KV_POOL, pool[1])
    ledger.adopt(KV_POOL, pool[:, 2:])
    ledger.adopt("someone-else", pool.transpose(0, 2))
    ledger.adopt(LAYERS, pool.view(-1)[5:9])
    assert ledger.live_bytes_by_owner() == {KV_POOL: 2 * 4 * 8 * 4}


def test_adopting_a_view_first_charges_its_whole_storage() -> None:
    ledger = MemoryLedger()
    base = torch.zeros(8, 8)
    ledger.adopt(LAYERS, base[2:4])
    ledger.adopt(LAYERS, base)
    assert ledger.live_bytes_by_owner() == {LAYERS: 256}


def test_tied_weights_are_charged_once_to_the_first_owner() -> None:
    embedding = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = embedding.weight
    ledger = MemoryLedger()
    ledger.adopt(EMBEDDINGS, embedding.weight)
    ledger.adopt(LM_HEAD, head.weight)
    assert ledger.live_bytes_by_owner() == {EMBEDDINGS: 100 * 16 * 4}


def test_a_released_tensor_can_be_adopted_again() -> None:
    ledger = MemoryLedger()
    table = torch.zeros(32)
    ledger.adopt(ROPE_TABLE, table)
    assert ledger.release(ROPE_TABLE) == 128
    ledger.adopt(ROPE_TABLE, table)
    assert ledger.live_bytes_by_owner() == {ROPE_TABLE: 128}


def test_concurrent_allocations_are_all_counted() -> None:
    ledger = MemoryLedger()

    def allocate_many(owner: str) -> None:
        for _ in range(200):
            ledger.allocate(owner, (4,), torch.float32, CPU)

    threads = [threading.Thread(target=allocate_many, args=(f"o{i % 2}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.live_bytes_by_owner() == {"o0": 2 * 200 * 16, "o1": 2 * 200 * 16}


# --- plan == ledger on every family -------------------------------------------------------


def hand_kv_bytes_per_token(dtype_bytes: int) -> int:
    return NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_DIM * dtype_bytes


@pytest.mark.parametrize(
    ("dtype", "quantization"), [("float32", "none"), ("bfloat16", "none"), ("float32", "int8")]
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_ledger_equals_plan_by_owner(
    family_dirs: dict[str, tuple[Path, dict[str, int]]],
    family: str,
    dtype: str,
    quantization: str,
) -> None:
    path, hf_fp32_weights = family_dirs[family]
    config = model_config_from_hf_file(path)
    for field, expected in FAMILIES[family][3].items():
        assert getattr(config, field) == expected, field
    engine = build_engine(
        EngineArgs(
            model=str(path),
            dtype=dtype,
            quantization=quantization,
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            max_batch_size=MAX_BATCH_SIZE,
            max_batch_tokens=MAX_BATCH_TOKENS,
        )
    )
    plan = engine.plan
    dtype_bytes = 4 if dtype == "float32" else 2
    allocated = plan.allocated_by_owner()
    assert engine.ledger.live_bytes_by_owner() == allocated
    assert engine.ledger.live_bytes() == sum(allocated.values())

    # The plan against numbers that do not come from the plan's code.
    weights = {o: s for o, s in allocated.items() if o.startswith("weights.")}
    if quantization == "none":
        hf = {owner: size * dtype_bytes // 4 for owner, size in hf_fp32_weights.items() if size}
        assert weights == hf
    else:  # a byte per value and a float32 scale per row: vocab rows of hidden values
        int8_table = config.vocab_size * (config.hidden_size + 4)
        assert weights[EMBEDDINGS] == int8_table
        assert weights.get(LM_HEAD, int8_table) == int8_table
        assert weights[LAYERS] < hf_fp32_weights[LAYERS] / 3
    assert (LM_HEAD in allocated) == (not config.tie_word_embeddings)
    assert plan.kv_bytes_per_token == hand_kv_bytes_per_token(dtype_bytes)
    blocks_per_seq = MAX_SEQ_LEN // BLOCK_SIZE
    assert engine.num_kv_blocks == MAX_BATCH_SIZE * blocks_per_seq  # this machine has room
    assert allocated[KV_POOL] == engine.num_kv_blocks * BLOCK_SIZE * plan.kv_bytes_per_token
    kv_tensor_bytes = sum(k.nbytes + v.nbytes for k, v in engine.core.runner.kv_caches)
    assert kv_tensor_bytes == allocated[KV_POOL]
    vocab = config.vocab_size
    # ids, positions and KV slots per token; a block-table row and a logits row per slot
    assert allocated[BUFFER_ARENA] == (
        3 * MAX_BATCH_TOKENS * 8 + MAX_BATCH_SIZE * (blocks_per_seq * 8 + vocab * dtype_bytes)
    )
    assert allocated[ROPE_TABLE] == MAX_SEQ_LEN * HEAD_DIM * 4
    assert RUNTIME_HEADROOM not in allocated
    assert set(allocated) <= set(plan.by_owner())


@pytest.mark.parametrize("num_kv_blocks", [5, 13])
def test_ledger_equals_plan_with_a_fixed_kv_pool(
    family_dirs: dict[str, tuple[Path, dict[str, int]]], num_kv_blocks: int
) -> None:
    path, _ = family_dirs["qwen2-qkv-bias"]
    engine = build_engine(
        EngineArgs(
            model=str(path),
            dtype="float32",
            device="cpu",
            max_seq_len=MAX_SEQ_LEN,
            num_kv_blocks=num_kv_blocks,
        )
    )
    assert engine.num_kv_blocks == num_kv_blocks
    assert engine.ledger.live_bytes_by_owner() == engine.plan.allocated_by_owner()
    assert engine.ledger.live_bytes_by_owner()[KV_POOL] == (
        num_kv_blocks * BLOCK_SIZE * hand_kv_bytes_per_token(4)
    )


@pytest.mark.parametrize("family", ["llama-tied", "llama-untied", "qwen3-qk-norm"])
def test_an_engine_given_a_loaded_model_charges_its_parameters(
    family_dirs: dict[str, tuple[Path, dict[str, int]]], family: str
) -> None:
    path, hf_fp32_weights = family_dirs[family]
    loaded = load_model(
        str(path), LoadOptions(dtype=torch.float32, device="cpu", max_seq_len=MAX_SEQ_LEN)
    )
    engine = build_engine(
        EngineArgs(max_seq_len=MAX_SEQ_LEN, device="cpu", max_batch_size=2), loaded
    )
    live = engine.ledger.live_bytes_by_owner()
    assert live == engine.plan.allocated_by_owner()
    assert {o: s for o, s in live.items() if o.startswith("weights.")} == {
        o: s for o, s in hf_fp32_weights.items() if s
    }
    param_bytes = sum(
        p.untyped_storage().nbytes()
        for p in {p.untyped_storage().data_ptr(): p for p in loaded.model.parameters()}.values()
    )
    assert sum(s for o, s in live.items() if o.startswith("weights.")) == param_bytes
    assert live[ROPE_TABLE] > 0


def test_ledger_is_unchanged_by_steps(
    family_dirs: dict[str, tuple[Path, dict[str, int]]],
) -> None:
    from metrale_server import LLM, SamplingParams

    path, _ = family_dirs["llama-untied"]
    engine = build_engine(EngineArgs(model=str(path), device="cpu", max_seq_len=MAX_SEQ_LEN))
    before = engine.ledger.live_bytes_by_owner()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = LLM.from_engine(engine).generate(["hello there", "one two three"], params)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outputs)
    assert engine.ledger.live_bytes_by_owner() == before == engine.plan.allocated_by_owner()
