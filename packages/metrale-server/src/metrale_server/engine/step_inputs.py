"""``StepInputs``: what one forward pass reads, as the runner prepared it from a scheduler step.

Rank 0 builds it and, with tensor parallelism, sends it to every worker, which runs the same
forward from it (workers hold no sequences).
"""

from __future__ import annotations

import attrs
import torch

from metrale_kernels import AttentionMetadata


@attrs.frozen(kw_only=True, eq=False)
class StepInputs:
    input_ids: torch.Tensor  # (tokens,) int64
    positions: torch.Tensor  # (tokens,) int64
    slot_mapping: torch.Tensor  # (tokens,) int64
    query_start_loc: torch.Tensor  # (seqs + 1,) int64
    seq_lens_tensor: torch.Tensor  # (seqs,) int64
    block_tables: torch.Tensor  # (seqs, blocks) int64
    state_slots: torch.Tensor | None  # (seqs,) int64
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    block_size: int
    # Flat index of each logits row's token; empty: no logits this step.
    logits_indices: tuple[int, ...]
    block_copies: tuple[tuple[int, int], ...] = ()

    def metadata(self) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping,
            query_start_loc=self.query_start_loc,
            seq_lens_tensor=self.seq_lens_tensor,
            block_tables=self.block_tables,
            query_lens=self.query_lens,
            seq_lens=self.seq_lens,
            block_size=self.block_size,
            state_slots=self.state_slots,
        )

    def detached(self) -> StepInputs:
        """A copy whose tensors own their storage (arena views would send the whole arena)."""
        return attrs.evolve(
            self,
            input_ids=self.input_ids.clone(),
            positions=self.positions.clone(),
            slot_mapping=self.slot_mapping.clone(),
        )
