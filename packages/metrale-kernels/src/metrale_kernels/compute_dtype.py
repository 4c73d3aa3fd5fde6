"""The dtype the ops reduce and keep state in: float32, or the serve dtype where it is wider.

Only float64 is wider: the exactness checks serve in it so that float32 rounding (about 1e-5
after a few layers) cannot hide an error the size of a wrong state. Everything else reduces in
float32 as before.
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or ``dtype`` where it is the wider float."""
    return torch.promote_types(dtype, torch.float32)


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in :func:`compute_dtype` of its own dtype: ``.float()`` that keeps float64."""
    return tensor.to(compute_dtype(tensor.dtype))
