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
    positions: torch.Tensor  # (tokens,) int64; (3, tokens) for M-RoPE prompt positions
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

    def to_host(self) -> StepInputs:
        """A copy on the CPU whose tensors own their storage: what is sent to the workers
        (an arena view would pickle the whole arena; a CUDA tensor would unpickle on the
        sender's device)."""
        return self.to(torch.device("cpu"), copy=True)

    def to(self, device: torch.device, *, copy: bool = False) -> StepInputs:
        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device, copy=copy)

        return attrs.evolve(
            self,
            input_ids=move(self.input_ids),
            positions=move(self.positions),
            slot_mapping=move(self.slot_mapping),
            query_start_loc=move(self.query_start_loc),
            seq_lens_tensor=move(self.seq_lens_tensor),
            block_tables=move(self.block_tables),
            state_slots=None if self.state_slots is None else move(self.state_slots),
        )
