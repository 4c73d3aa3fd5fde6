"""The model runner: a scheduler step in, flat tensors through the model, logits out."""

from __future__ import annotations

import torch

from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadedModel, TensorAllocator, allocate_kv_cache, plain_allocator
from metrale_model_arch.memory import BUFFER_ARENA, arena_buffers
from metrale_server.engine.scheduler_step import SchedulerStep


class ModelRunner:
    """Owns the KV pool and the step arena (each allocated once) and runs steps over them.

    ``execute`` returns one logits row per chunk that samples (in step order), float32. The
    rows live in the arena's logits buffer: they are valid until the next ``execute``.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        num_blocks: int,
        block_size: int,
        max_batch_tokens: int,
        max_batch_size: int,
        allocator: TensorAllocator = plain_allocator,
    ) -> None:
        self.loaded = loaded
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = loaded.device
        self.kv_caches = allocate_kv_cache(
            loaded.config,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=loaded.dtype,
            device=loaded.device,
            allocator=allocator,
        )
        dtypes = {"int64": torch.int64, "model": loaded.dtype}
        arena = {
            buffer.name: allocator(BUFFER_ARENA, buffer.shape, dtypes[buffer.dtype], self.device)
            for buffer in arena_buffers(
                loaded.config,
                max_batch_tokens=max_batch_tokens,
                max_batch_size=max_batch_size,
                dtype_bytes=loaded.dtype.itemsize,
            )
        }
        self._input_ids = arena["input_ids"]
        self._positions = arena["positions"]
        self._logits = arena["logits"]

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.int64, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=self.device)
        self.kv_caches.copy_blocks(src, dst)

    def prepare_inputs(self, step: SchedulerStep) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Token ids and positions (views of the arena), and the flat index of each sampling
        chunk's last token."""
        token_ids: list[int] = []
        positions: list[int] = []
        logits_indices: list[int] = []
        for chunk in step.chunks:
            end = chunk.start + chunk.num_new_tokens
            token_ids += chunk.seq.token_ids[chunk.start : end]
            positions += range(chunk.start, end)
            if chunk.samplers:
                logits_indices.append(len(token_ids) - 1)
        num_tokens = len(token_ids)
        input_ids = self._input_ids[:num_tokens]
        input_ids.copy_(torch.tensor(token_ids, dtype=torch.int64))
        position_ids = self._positions[:num_tokens]
        position_ids.copy_(torch.tensor(positions, dtype=torch.int64))
        return input_ids, position_ids, logits_indices

    @torch.inference_mode()
    def execute(self, step: SchedulerStep) -> torch.Tensor:
        self.copy_blocks(step.block_copies)
        input_ids, positions, logits_indices = self.prepare_inputs(step)
        metadata = build_attention_metadata(
            block_tables=[chunk.seq.block_table for chunk in step.chunks],
            seq_lens=[chunk.start + chunk.num_new_tokens for chunk in step.chunks],
            query_lens=[chunk.num_new_tokens for chunk in step.chunks],
            block_size=self.block_size,
            device=self.device,
        )
        hidden: torch.Tensor = self.loaded.model(input_ids, positions, self.kv_caches, metadata)
        if not logits_indices:
            return hidden.new_empty((0, self.loaded.config.vocab_size), dtype=torch.float32)
        index = torch.tensor(logits_indices, dtype=torch.int64, device=self.device)
        out = self._logits[: len(logits_indices)]
        logits: torch.Tensor = self.loaded.model.compute_logits(hidden[index], out=out)
        return logits.float()
