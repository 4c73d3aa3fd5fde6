"""Verification rows under a grammar: each masked with what the grammar allows at its position.

Row ``j`` predicts the token after the first ``j`` drafts, so its mask is the grammar's state
after them. The matcher is advanced through the drafts it accepts to fill the rows, then rolled
back: the engine advances it again through the tokens verification keeps. Rows after a draft
the grammar refuses take that draft's row's mask; they are never read, since the refused draft
has probability 0 under its mask and verification stops there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_server.structured import GrammarMatcher, allocate_bitmask, apply_bitmask_


def mask_by_grammar(logits: torch.Tensor, drafts: Sequence[int], matcher: GrammarMatcher) -> None:
    """Mask ``logits`` rows ``0..len(drafts)`` in place; ``matcher`` ends as it began."""
    num_rows = len(drafts) + 1
    bitmask = allocate_bitmask(num_rows, matcher.grammar.vocab_size)
    advanced = 0
    for row in range(num_rows):
        matcher.fill_bitmask(bitmask, row)
        if row == len(drafts) or not matcher.accept_token(drafts[row]):
            bitmask[row + 1 :] = bitmask[row]
            break
        advanced += 1
    matcher.rollback(advanced)
    rows = torch.arange(num_rows, dtype=torch.int64, device=logits.device)
    apply_bitmask_(logits[:num_rows], bitmask, rows)
