"""``PoolingParams``: a request that reads one vector (an embedding, a score) from its prompt
instead of generating."""

from __future__ import annotations

from typing import Literal

import attrs

PoolingMethod = Literal["last", "mean", "cls"]
POOLING_METHODS: tuple[PoolingMethod, ...] = ("last", "mean", "cls")


@attrs.frozen(kw_only=True)
class PoolingParams:
    """How a pooling request's vector is read from the final hidden states of its prompt.

    ``method``: the last token's state (decoder embedding models such as Qwen3-Embedding),
    the mean over every prompt token, or the first token's (``cls``). ``dimensions`` keeps the
    first that many components (a Matryoshka model's shorter embedding), before ``normalize``
    scales the vector to unit L2 norm.

    ``score_token_ids`` = ``(false_id, true_id)`` makes it a causal-LM reranker's score
    (Qwen3-Reranker's ``no``/``yes``): the vector is the one probability
    ``sigmoid(logit[true_id] - logit[false_id])`` of the last token's logits, the softmax over
    the pair; ``method``, ``dimensions`` and ``normalize`` do not apply then.
    """

    method: PoolingMethod = "last"
    normalize: bool = True
    dimensions: int | None = None
    score_token_ids: tuple[int, int] | None = None

    def __attrs_post_init__(self) -> None:
        if self.method not in POOLING_METHODS:
            raise ValueError(
                f"pooling method must be one of {POOLING_METHODS}, got {self.method!r}"
            )
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be at least 1, got {self.dimensions}")

    @property
    def is_score(self) -> bool:
        return self.score_token_ids is not None

    @property
    def reads_every_position(self) -> bool:
        """Whether every prompt position's state is read (so no prefix-cache hit may skip
        one): mean and cls pooling; last-token pooling and scores read the last only."""
        return not self.is_score and self.method != "last"
