"""An fp8 checkpoint's weight as stored, for an fp8 model to keep its bytes as they are.

An fp8 projection (:class:`~metrale_model_arch.families.fp8_layers.Fp8Linear`) holds
float8_e4m3fn weights and a float32 scale per output channel. A compressed-tensors checkpoint
per channel stores exactly that (its scale perhaps in bfloat16 or float16, which float32 holds
exactly); a per-tensor one (vLLM's ``fp8``, compressed-tensors ``tensor``) has one scale, which
is every row's: the same products. Either is moved in as stored, no dequantize and requantize.
A block-scaled checkpoint (DeepSeek's 128 x 128) has no per-row form: its weights come
dequantized and the fp8 layer quantizes them per channel again (lossy, said in the boot log).
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen(eq=False)
class Fp8Rows:
    """``q`` float8_e4m3fn ``(rows, cols)`` and ``scale`` float32 ``(rows,)``:
    ``w[n, :] = scale[n] * q[n, :]``."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix ``scale[:, None] * q``."""
        return self.q.to(torch.float32) * self.scale.unsqueeze(-1)


def fp8_rows_of(q: torch.Tensor, scale: torch.Tensor) -> Fp8Rows:
    """A checkpoint's fp8 ``q (rows, cols)`` and its per-tensor (``()``, ``(1,)``, ``(1, 1)``) or
    per-channel (``(rows, 1)``) ``scale``, as rows with a float32 scale each."""
    rows = q.shape[0]
    return Fp8Rows(q=q, scale=scale.to(torch.float32).reshape(-1).expand(rows).contiguous())
