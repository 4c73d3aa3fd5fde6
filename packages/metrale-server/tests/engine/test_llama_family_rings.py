"""Sliding-window rings for the llama family: tiny random float32 mistral (a window of 8 on
every layer), qwen2 and qwen2_5_vl's text (``use_sliding_window``, ``max_window_layers`` 1: the
second of two layers slides) and mixtral (a window of 8 on every layer, 4 experts); blocks of
4, steps of 16 tokens, prompts and generations several windows long. Greedy tokens equal
transformers' (which slides: with a window wider than the sequences it picks others) and the
full pool's, batched, alone, chunked and preempted, on the cpu and torch backends, and under
speculation; int8 and q4 weights run the native decode layer over the rings (int8 K/V rows
too); the compiled segments run beside the ring's attention; plan == ledger with the rings
priced per slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import randomize_weights, save_random_model
from metrale_testing.greedy import transformers_greedy

from metrale_config import SLIDING_ATTENTION, model_config_from_hf_file
from metrale_kernels.cpu.native import load_native_ops_if_possible
from metrale_model_arch import Tokenizer
from metrale_model_arch.families.compiled_steps import compile_executor
from metrale_model_arch.families.llama import LlamaForCausalLM
from metrale_server import LLM
from metrale_server.speculative_config import SpeculativeConfig

from .test_sliding_window_ring_engine import (
    ENGINE,
    GREEDY,
    NUM_TOKENS,
    STEP_TOKENS,
    assert_ledger_prices_each_ring_per_slot,
    greedy,
    make_prompts,
    ring_specs,
)

transformers = pytest.importorskip("transformers")

WINDOW = 8
# family -> transformers' config and model classes, and their fields beside the 2-layer shape.
FAMILIES: dict[str, tuple[str, str, dict[str, object]]] = {
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
}
ALL = (*FAMILIES, "qwen2_5_vl")
DENSE = ("mistral", "qwen2")
# mistral and mixtral slide on every layer, qwen2 and qwen2_5_vl on their second.
SLIDING_LAYERS = {"mistral": 2, "qwen2": 1, "mixtral": 2, "qwen2_5_vl": 1}
# Qwen2.5-VL's text stack (beside a one-block tower; the prompts are text only).
QWEN2_5_VL_TEXT: dict[str, object] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
    "use_sliding_window": True,
    "sliding_window": WINDOW,
    "max_window_layers": 1,
}
QWEN2_5_VL_TOWER: dict[str, object] = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 48,
    "out_hidden_size": 64,
    "patch_size": 4,
    "fullatt_block_indexes": [0],
}
# transformers' class of each family whose causal LM ``AutoModelForCausalLM`` does not make.
HF_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}


def save_qwen2_5_vl(path: Path, tokenizer: Tokenizer) -> Path:
    # Image and vision token ids below the prompts' (100 on).
    ids = {"vocab_size": tokenizer.vocab_size, "bos_token_id": tokenizer.bos_token_id}
    config = transformers.Qwen2_5_VLConfig(
        text_config={**QWEN2_5_VL_TEXT, **ids, "eos_token_id": tokenizer.eos_token_id},
        vision_config=QWEN2_5_VL_TOWER,
        image_token_id=1,
        video_token_id=2,
        vision_start_token_id=3,
        vision_end_token_id=4,
    )
    model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    randomize_weights(model, torch.Generator().manual_seed(0))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(path)
    return path


@pytest.fixture(scope="module")
def model_dirs(
    tmp_path_factory: pytest.TempPathFactory, default_tokenizer: Tokenizer
) -> dict[str, Path]:
    dirs = {}
    for family, (config_name, model_name, extra) in FAMILIES.items():
        intermediate = 32 if family == "mixtral" else 96
        dirs[family] = save_random_model(
            tmp_path_factory.mktemp(family),
            default_tokenizer,
            config_name,
            model_name,
            intermediate_size=intermediate,
            **extra,
        )
    dirs["qwen2_5_vl"] = save_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"), default_tokenizer)
    return dirs


def hf_greedy(
    family: str, path: Path, prompts: list[list[int]], window: int = WINDOW
) -> list[list[int]]:
    """transformers' greedy tokens, its layers' window made ``window``."""
    config = transformers.AutoConfig.from_pretrained(path)
    config.get_text_config().sliding_window = window
    model_class = getattr(transformers, HF_CLASSES.get(family, "AutoModelForCausalLM"))
    hf_model = model_class.from_pretrained(path, config=config, dtype=torch.float32).eval()
    return [transformers_greedy(hf_model, prompt, NUM_TOKENS) for prompt in prompts]


@pytest.fixture(scope="module")
def expected(model_dirs: dict[str, Path]) -> dict[str, list[list[int]]]:
    """Each family's transformers greedy tokens for ``make_prompts()``."""
    return {family: hf_greedy(family, path, make_prompts()) for family, path in model_dirs.items()}


@pytest.mark.parametrize("family", ALL)
def test_ring_greedy_equals_transformers_and_the_full_pool(
    model_dirs: dict[str, Path], expected: dict[str, list[list[int]]], family: str
) -> None:
    path = model_dirs[family]
    prompts = make_prompts()
    assert max(map(len, prompts)) + NUM_TOKENS > 5 * WINDOW
    config = model_config_from_hf_file(path)
    assert config.sliding_window == WINDOW
    assert sum(kind == SLIDING_ATTENTION for kind in config.layer_types) == SLIDING_LAYERS[family]
    # transformers slides: with a window wider than every sequence it picks other tokens.
    assert hf_greedy(family, path, prompts[:1], window=1000) != expected[family][:1]
    ring, batched = greedy(path, prompts, max_batch_size=4)
    assert len(ring_specs(ring)) == SLIDING_LAYERS[family]
    assert ring.engine.core.scheduler.config.max_seq_step_tokens == STEP_TOKENS
    assert not ring.engine.core.prefix_caching
    assert batched == expected[family]
    assert greedy(path, prompts, max_batch_size=4, sliding_window_cache="full")[1] == batched
    # Each prompt alone, and in prefill chunks of 7 tokens.
    assert greedy(path, prompts, max_batch_size=1)[1] == batched
    assert greedy(path, prompts, max_batch_size=4, max_batch_tokens=7)[1] == batched
    # 20 blocks of 4 for 2 sequences of up to 68 tokens: preemption and recompute.
    preempted, tokens = greedy(path, prompts, max_batch_size=2, num_kv_blocks=20)
    assert preempted.engine.core.scheduler.num_preemptions > 0
    assert tokens == batched


@pytest.mark.parametrize("family", ALL)
def test_the_torch_backend_over_the_ring_equals_transformers(
    model_dirs: dict[str, Path], expected: dict[str, list[list[int]]], family: str
) -> None:
    path = model_dirs[family]
    prompts = make_prompts()
    assert greedy(path, prompts, max_batch_size=4, kernel_backend="torch")[1] == expected[family]
    chunked = greedy(path, prompts, max_batch_size=2, max_batch_tokens=7, kernel_backend="torch")
    assert chunked[1] == expected[family]


@pytest.mark.parametrize("drafter", ["mistral", "qwen2"])
def test_speculation_over_mistral_rings_keeps_greedy(
    model_dirs: dict[str, Path], drafter: str
) -> None:
    path = model_dirs["mistral"]
    prompts = make_prompts(seed=3)
    _, plain = greedy(path, prompts, max_batch_size=4)
    speculative = SpeculativeConfig(
        method="draft_model", model=str(model_dirs[drafter]), num_speculative_tokens=4
    )
    llm, tokens = greedy(path, prompts, max_batch_size=4, speculative_config=speculative)
    stats = llm.engine.stats
    assert stats.num_draft_tokens > 20
    if drafter == "mistral":  # verify steps of 5 rows through the ring
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    else:  # rejected drafts overwrote ring rows that no query reads again
        assert stats.num_accepted_tokens < stats.num_draft_tokens / 2
    assert tokens == plain


def native_greedy(path: Path, prompts: list[list[int]], **args: Any) -> list[list[int]]:
    """Greedy tokens of int8 or q4 weights, the native executor running every layer's segments
    (and a decode-only step's whole layer, attention included)."""
    llm, tokens = greedy(path, prompts, **args)
    assert llm.engine.loaded.model.executor_name == "native"
    return tokens


@pytest.mark.parametrize(
    ("quantization", "kv_cache_dtype"), [("int8", "auto"), ("int8", "int8"), ("q4", "auto")]
)
@pytest.mark.parametrize("family", DENSE)
def test_the_native_decode_layer_over_the_ring_equals_the_full_pool(
    model_dirs: dict[str, Path], family: str, quantization: str, kv_cache_dtype: str
) -> None:
    if load_native_ops_if_possible() is None:
        pytest.skip("the native CPU ops cannot be built here")
    path = model_dirs[family]
    prompts = make_prompts(seed=1)
    args: dict[str, Any] = {"quantization": quantization, "kv_cache_dtype": kv_cache_dtype}
    batched = native_greedy(path, prompts, max_batch_size=4, **args)
    full = native_greedy(path, prompts, max_batch_size=4, sliding_window_cache="full", **args)
    assert batched == full
    assert native_greedy(path, prompts, max_batch_size=1, **args) == batched
    assert native_greedy(path, prompts, max_batch_size=2, num_kv_blocks=20, **args) == batched


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_the_compiled_segments_beside_the_ring_equal_the_full_pool(
    model_dirs: dict[str, Path],
) -> None:
    path = model_dirs["qwen2"]
    prompts = make_prompts(seed=2)
    tokens = []
    for cache in ("ring", "full"):
        llm = LLM(str(path), **ENGINE, max_batch_size=4, sliding_window_cache=cache)
        model = llm.engine.loaded.model
        assert isinstance(model, LlamaForCausalLM)
        model.install_executor(compile_executor(model))
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
        assert model.executor_name == "compiled"
        tokens.append([list(o.outputs[0].token_ids) for o in outputs])
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("family", ALL)
def test_ledger_equals_plan_with_the_ring_priced_per_slot(
    model_dirs: dict[str, Path], family: str
) -> None:
    assert_ledger_prices_each_ring_per_slot(model_dirs[family], SLIDING_LAYERS[family])
