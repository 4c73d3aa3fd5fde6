"""A GGUF Q4_1 tensor as read, for a q4 model to take its blocks as they are.

A q4 projection (:class:`~metrale_model_arch.families.q4_layers.Q4Linear`) holds exactly a
Q4_1 file's blocks (``w = d * q + m``); dequantizing them to float32 and quantizing again
gives the same bytes, at ~0.8 s of the default model's start. ``Q4_1Blocks`` keeps the file's
bytes instead: the q4 layer moves them into its layout, anything else asks for the floats.
"""

from __future__ import annotations

import attrs
import gguf
import numpy as np
import torch

from metrale_kernels.reference.q4_matmul import pack_ggml_q4_1
from metrale_model_arch.gguf_dequant import dequantize

Q4_1_BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of nibbles
_VALUES = 32


@attrs.frozen(eq=False)
class Q4_1Blocks:  # noqa: N801 (ggml's name for the format)
    """``raw`` uint8 ``(rows, blocks * 20)``: a Q4_1 tensor's rows, HF's row order."""

    raw: np.ndarray

    @property
    def shape(self) -> torch.Size:
        rows, row_bytes = self.raw.shape
        return torch.Size((rows, row_bytes // Q4_1_BLOCK_BYTES * _VALUES))

    def __getitem__(self, index: tuple[slice, ...]) -> Q4_1Blocks | torch.Tensor:
        """A tensor-parallel shard's part (``(rows,)`` or ``(rows, columns)``, step 1): blocks
        still when the columns start and end on blocks, else the part's floats."""
        rows = index[0] if index else slice(None)
        if len(index) < 2:
            return Q4_1Blocks(self.raw[rows])
        start, stop, step = index[1].indices(self.shape[1])
        if step != 1 or start % _VALUES or stop % _VALUES:
            return self.dequantize()[index]
        return Q4_1Blocks(
            self.raw[rows, start // _VALUES * Q4_1_BLOCK_BYTES : stop // _VALUES * Q4_1_BLOCK_BYTES]
        )

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix ``d * q + m``."""
        return torch.from_numpy(dequantize(self.raw, gguf.GGMLQuantizationType.Q4_1))

    def q4_panels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed, scales)`` in the q4 kernel's layout
        (``metrale_kernels.reference.q4_matmul``)."""
        rows = self.raw.shape[0]
        # A copy: ``raw`` may be a view of the read-only file mapping.
        blocks = torch.from_numpy(np.array(self.raw)).reshape(rows, -1, Q4_1_BLOCK_BYTES)
        step = blocks[:, :, 0:2].contiguous().view(torch.float16).squeeze(-1)
        minimum = blocks[:, :, 2:4].contiguous().view(torch.float16).squeeze(-1)
        return pack_ggml_q4_1(blocks[:, :, 4:], step, minimum)


def dense(tensor: torch.Tensor | Q4_1Blocks) -> torch.Tensor:
    """``tensor`` as floats (dequantized when it is blocks)."""
    return tensor.dequantize() if isinstance(tensor, Q4_1Blocks) else tensor
