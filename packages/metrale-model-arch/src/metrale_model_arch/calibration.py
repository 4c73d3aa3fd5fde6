"""What GPTQ calibrates on: a text, its first tokens, and the Gram matrix ``X^T X`` of a
projection's inputs while the model reads them (its Hessian ``H = 2 X^T X / tokens``).

The procedure, a layer at a time over the model quantized so far, is
:mod:`~metrale_model_arch.sequential_calibration`'s.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from metrale_model_arch.tokenizer import Tokenizer

CHUNK_TOKENS = 512
DEFAULT_CALIBRATION_TOKENS = 2048


@attrs.frozen(kw_only=True)
class Calibration:
    """A text to calibrate on and how many of its tokens to read."""

    text_path: Path
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS


def calibration_chunks(tokenizer: Tokenizer, calibration: Calibration) -> list[list[int]]:
    """The first ``calibration.num_tokens`` tokens of the text, in chunks of
    :data:`CHUNK_TOKENS`, each read as a fresh sequence."""
    text = calibration.text_path.read_text(encoding="utf-8")
    tokens = tokenizer.encode(text, add_special_tokens=True)[: calibration.num_tokens]
    if len(tokens) < 2:
        raise ValueError(f"{calibration.text_path} has {len(tokens)} tokens: nothing to read")
    return [tokens[start : start + CHUNK_TOKENS] for start in range(0, len(tokens), CHUNK_TOKENS)]


@attrs.define(eq=False)
class InputGram:
    """``X^T X`` summed in float64 over the inputs a module has seen (a forward pre-hook)."""

    num_features: int
    total: torch.Tensor = attrs.field(init=False)
    num_tokens: int = 0

    def __attrs_post_init__(self) -> None:
        self.total = torch.zeros(self.num_features, self.num_features, dtype=torch.float64)

    def add(self, _: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0].detach().reshape(-1, self.num_features).to(torch.float64)
        self.total += x.t() @ x
        self.num_tokens += x.shape[0]

    @property
    def hessian(self) -> torch.Tensor:
        """``2 X^T X / tokens``, float32."""
        return (2 * self.total / max(self.num_tokens, 1)).to(torch.float32)
