"""``PenaltyState``: one sequence's penalty inputs, kept on the device and updated per token."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PenaltyState:
    """Which tokens a sequence has seen (prompt and output: the repetition penalty) and how
    often each was generated (output only: frequency and presence penalties).

    Built once from the sequence's tokens, then ``add_output_token`` costs O(1) a token, so a
    step's penalty work does not grow with the sequence's length.
    """

    def __init__(
        self,
        prompt_token_ids: Sequence[int],
        output_token_ids: Sequence[int],
        vocab_size: int,
        device: torch.device,
    ) -> None:
        in_vocab = [t for t in (*prompt_token_ids, *output_token_ids) if 0 <= t < vocab_size]
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.seen[torch.tensor(in_vocab, dtype=torch.int64, device=device)] = True
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        outputs = torch.tensor(
            [t for t in output_token_ids if 0 <= t < vocab_size], dtype=torch.int64, device=device
        )
        self.output_counts.index_put_(
            (outputs,), torch.ones_like(outputs, dtype=torch.float32), accumulate=True
        )
        self._vocab_size = vocab_size

    @torch.inference_mode()
    def add_output_token(self, token_id: int) -> None:
        # The state is built inside the runner's inference mode: its tensors are inference
        # tensors, which only inference mode may update in place.
        if 0 <= token_id < self._vocab_size:
            self.seen[token_id] = True
            self.output_counts[token_id] += 1.0
