"""The MTP proposer's own per-sequence state, allocated as the plan prices it.

One row per state slot of each tensor :func:`~metrale_model_arch.memory.proposer_buffers`
names (seed 003's ``Glm5NextMtpHead::alloc_state``), owner ``proposer_state``: exactly
``per_sequence_state_bytes(...).proposer`` times the slots, byte for byte.
"""

from __future__ import annotations

import attrs
import torch

from metrale_config import ModelConfig
from metrale_model_arch.allocator import TensorAllocator
from metrale_model_arch.memory.seq_state_reserve import proposer_buffers
from metrale_model_arch.owners import PROPOSER_STATE

_TORCH_DTYPES = {
    "float32": torch.float32,
    "uint8": torch.uint8,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
}


@attrs.frozen(kw_only=True)
class ProposerState:
    """``tensors[role]`` is ``(slots, *shape)``. The drafter layer reads ``indexer``, its flat
    DSA indexer ``(index_keys (slots, capacity, dim) float32, index_flags (slots, capacity)
    uint8)``.

    NOTE: the Python proposer uses only the indexer. The seed's five fixed buffers (``concat``,
    ``x``, ``logits``, ``arg``, ``head_xchg``: the Rust head's staging of its inputs, output
    and argmax) are allocated so that the owner holds what the seed reserves; here the same
    values are the step's torch temporaries.
    """

    tensors: dict[str, torch.Tensor]
    num_slots: int

    @property
    def indexer(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensors["index_keys"], self.tensors["index_flags"]

    def reset(self, slot: int) -> None:
        """Zero ``slot``'s indexer: a drafter cache starting over."""
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} is outside 0..{self.num_slots - 1}")
        for tensor in self.indexer:
            tensor[slot].zero_()


def allocate_proposer_state(
    config: ModelConfig,
    *,
    num_slots: int,
    max_seq_len: int,
    device: torch.device | str,
    allocator: TensorAllocator,
) -> ProposerState | None:
    """``num_slots`` slots of ``config``'s proposer state, zeroed; ``None`` for a drafter that
    owns none (no DSA layer)."""
    buffers = proposer_buffers(config, max_seq_len)
    if not buffers:
        return None
    device = torch.device(device)
    tensors = {
        buffer.role: allocator(
            PROPOSER_STATE, (num_slots, *buffer.shape), _TORCH_DTYPES[buffer.dtype], device
        ).zero_()
        for buffer in buffers
    }
    return ProposerState(tensors=tensors, num_slots=num_slots)
