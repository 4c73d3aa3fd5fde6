"""``SamplingBatch``: one step's per-row sampling settings, turned into device tensors once."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs
import torch

from metrale_server.sampling.params import SamplingParams
from metrale_server.sampling.penalty_state import PenaltyState
from metrale_server.structured import GrammarMatcher, allocate_bitmask, fill_bitmasks


def make_seeded_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """The generator a seeded request keeps for its whole life (on the logits' device)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


@attrs.frozen(kw_only=True, eq=False, repr=False)
class SamplingRow:
    """What the sampler needs to know about one sequence sampled this step.

    ``generator`` is the request's own seeded generator (required when ``params.seed`` is set,
    on the logits' device); unseeded rows leave it ``None``. ``eos_token_ids`` are the model's
    end-of-sequence ids: while fewer than ``params.min_tokens`` tokens were generated, they
    (unless ``params.ignore_eos``) and ``params.stop_token_ids`` cannot be sampled.
    ``penalty`` is the sequence's penalty state, required when ``params`` has a penalty.
    ``grammar`` (structured outputs) masks every token it does not allow; it alone decides
    when EOS may come, so ``min_tokens`` does not suppress EOS in such a row.
    """

    params: SamplingParams
    num_output_tokens: int = 0
    penalty: PenaltyState | None = None
    generator: torch.Generator | None = None
    eos_token_ids: tuple[int, ...] = ()
    grammar: GrammarMatcher | None = None

    def __attrs_post_init__(self) -> None:
        if self.params.seed is not None and self.generator is None:
            raise ValueError("a request with a seed needs its generator (make_seeded_generator)")
        if self.penalty is None and has_penalty(self.params):
            raise ValueError("a request with a penalty needs its PenaltyState")

    @property
    def suppressed_token_ids(self) -> tuple[int, ...]:
        if self.num_output_tokens >= self.params.min_tokens:
            return ()
        is_eos_free = self.params.ignore_eos or self.grammar is not None
        eos_token_ids = () if is_eos_free else self.eos_token_ids
        return (*eos_token_ids, *sorted(self.params.stop_token_ids))

    def __repr__(self) -> str:
        return (
            f"SamplingRow(output_tokens={self.num_output_tokens}, "
            f"is_seeded={self.generator is not None})"
        )


@attrs.frozen(kw_only=True, eq=False, repr=False)
class SparseLogitUpdate:
    """Entries ``(row_indices[i], token_ids[i])`` of a (rows, vocab) logits tensor to change."""

    row_indices: torch.Tensor  # (entries,) int64
    token_ids: torch.Tensor  # (entries,) int64
    values: torch.Tensor  # (entries,) float32, or a 0-d tensor applied to every entry


@attrs.frozen(kw_only=True, eq=False, repr=False)
class GrammarMaskTensors:
    """Row ``k`` of ``bitmask`` says which tokens row ``row_indices[k]`` may take (bit set)."""

    row_indices: torch.Tensor  # (grammar_rows,) int64
    bitmask: torch.Tensor  # (grammar_rows, ceil(vocab / 32)) int32


@attrs.frozen(kw_only=True, eq=False, repr=False)
class PenaltyTensors:
    """Penalties for the rows ``row_indices`` (the only rows with a non-neutral penalty).

    ``seen_token_mask`` marks prompt and output tokens (repetition penalty) and is ``None``
    when no row has one; ``output_token_counts`` counts output tokens (frequency and presence
    penalties) and is ``None`` when no row has either.
    """

    row_indices: torch.Tensor  # (penalty_rows,) int64
    repetition_penalties: torch.Tensor  # (penalty_rows,) float32
    frequency_penalties: torch.Tensor  # (penalty_rows,) float32
    presence_penalties: torch.Tensor  # (penalty_rows,) float32
    seen_token_mask: torch.Tensor | None  # (penalty_rows, vocab) bool
    output_token_counts: torch.Tensor | None  # (penalty_rows, vocab) float32


@attrs.frozen(kw_only=True, eq=False, repr=False)
class TopPTensors:
    """Top-p of the random rows at ``positions`` (indices into the random rows).

    Only the ``num_candidates`` most likely tokens of a row can survive: ``vocab_size``, or the
    largest top-k of these rows when every one of them also has a top-k.
    """

    positions: torch.Tensor  # (top_p_rows,) int64
    is_every_row: bool
    top_ps: torch.Tensor  # (top_p_rows,) float32
    num_candidates: int


@attrs.frozen(kw_only=True, eq=False, repr=False)
class RandomSamplingTensors:
    """Settings of the rows that draw a token (temperature > 0), in ``row_indices`` order.

    ``top_ks`` holds ``vocab_size`` for rows without a top-k filter; each filter is ``None``
    when no row uses it. When every row has a top-k (``is_top_k_every_row``) only the
    ``max_top_k`` most likely tokens of each row can be drawn. ``generators[i]`` is row
    ``row_indices[i]``'s own generator or None.
    """

    row_indices: torch.Tensor  # (random_rows,) int64
    is_every_row: bool
    temperatures: torch.Tensor  # (random_rows,) float32
    top_ks: torch.Tensor | None  # (random_rows,) int64
    max_top_k: int
    is_top_k_every_row: bool
    top_p: TopPTensors | None
    min_ps: torch.Tensor | None  # (random_rows,) float32
    generators: tuple[torch.Generator | None, ...]


@attrs.frozen(kw_only=True, eq=False, repr=False)
class SamplingBatch:
    """Everything ``sample`` needs for one step's (num_rows, vocab_size) logits.

    Built by ``prepare_sampling_batch``; every stage a batch does not use is ``None`` so the
    sampler skips it without reading a device value.
    """

    num_rows: int
    vocab_size: int
    logit_bias: SparseLogitUpdate | None
    suppressed_tokens: SparseLogitUpdate | None
    penalties: PenaltyTensors | None
    grammar: GrammarMaskTensors | None
    random: RandomSamplingTensors | None
    num_logprobs: tuple[int | None, ...]
    logprob_row_indices: torch.Tensor | None  # (logprob_rows,) int64, rows that asked
    max_num_logprobs: int

    @property
    def has_logit_processors(self) -> bool:
        """Whether any stage before greedy/logprobs changes the logits."""
        return (
            self.logit_bias is not None
            or self.suppressed_tokens is not None
            or self.penalties is not None
            or self.grammar is not None
        )

    def __repr__(self) -> str:
        stages = [
            name
            for name, stage in (
                ("logit_bias", self.logit_bias),
                ("min_tokens", self.suppressed_tokens),
                ("penalties", self.penalties),
                ("grammar", self.grammar),
                ("random", self.random),
                ("logprobs", self.logprob_row_indices),
            )
            if stage is not None
        ]
        return f"SamplingBatch(rows={self.num_rows}, vocab={self.vocab_size}, stages={stages})"


def _flat_row_tokens(
    row_tokens: Sequence[tuple[int, Sequence[int]]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token ids) pairs → flat row-index and token-id tensors on ``device``."""
    lengths = torch.tensor([len(tokens) for _, tokens in row_tokens], dtype=torch.int64)
    rows = torch.tensor([row for row, _ in row_tokens], dtype=torch.int64)
    token_ids = torch.tensor(
        list(itertools.chain.from_iterable(tokens for _, tokens in row_tokens)), dtype=torch.int64
    )
    row_indices = torch.repeat_interleave(rows, lengths)
    return row_indices.to(device), token_ids.to(device)


def _prepare_logit_bias(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> SparseLogitUpdate | None:
    # A row's biases go into tensors in one conversion each (no Python loop over the entries):
    # up to 300 entries a row, every step, for every sequence that asked.
    biased = [(index, bias) for index, row in enumerate(rows) if (bias := row.params.logit_bias)]
    if not biased:
        return None
    token_ids = torch.cat([torch.tensor(list(bias), dtype=torch.int64) for _, bias in biased])
    if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size:
        outside = token_ids[(token_ids < 0) | (token_ids >= vocab_size)][0]
        raise ValueError(
            f"logit_bias: token id {int(outside)} is outside the vocabulary 0..{vocab_size - 1}"
        )
    values = torch.cat(
        [torch.tensor(list(bias.values()), dtype=torch.float32) for _, bias in biased]
    )
    lengths = torch.tensor([len(bias) for _, bias in biased], dtype=torch.int64)
    row_indices = torch.repeat_interleave(
        torch.tensor([index for index, _ in biased], dtype=torch.int64), lengths
    )
    return SparseLogitUpdate(
        row_indices=row_indices.to(device), token_ids=token_ids.to(device), values=values.to(device)
    )


def _prepare_suppressed_tokens(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> SparseLogitUpdate | None:
    # Ids outside the vocabulary can never be sampled, so there is nothing to suppress.
    row_tokens = [
        (index, [token_id for token_id in suppressed if 0 <= token_id < vocab_size])
        for index, row in enumerate(rows)
        if (suppressed := row.suppressed_token_ids)
    ]
    if not row_tokens:
        return None
    row_indices, token_ids = _flat_row_tokens(row_tokens, device)
    return SparseLogitUpdate(
        row_indices=row_indices,
        token_ids=token_ids,
        values=torch.tensor(float("-inf"), dtype=torch.float32, device=device),
    )


def has_penalty(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _prepare_penalties(rows: Sequence[SamplingRow], device: torch.device) -> PenaltyTensors | None:
    penalized = [(index, row) for index, row in enumerate(rows) if has_penalty(row.params)]
    if not penalized:
        return None
    values = torch.tensor(
        [
            (
                row.params.repetition_penalty,
                row.params.frequency_penalty,
                row.params.presence_penalty,
            )
            for _, row in penalized
        ],
        dtype=torch.float32,
    ).to(device)
    states = [row.penalty for _, row in penalized]
    assert all(state is not None for state in states)
    is_repetition_used = any(row.params.repetition_penalty != 1.0 for _, row in penalized)
    is_count_used = any(
        row.params.frequency_penalty != 0.0 or row.params.presence_penalty != 0.0
        for _, row in penalized
    )
    return PenaltyTensors(
        row_indices=torch.tensor([index for index, _ in penalized], dtype=torch.int64).to(device),
        repetition_penalties=values[:, 0],
        frequency_penalties=values[:, 1],
        presence_penalties=values[:, 2],
        seen_token_mask=(
            torch.stack([s.seen for s in states if s is not None]) if is_repetition_used else None
        ),
        output_token_counts=(
            torch.stack([s.output_counts for s in states if s is not None])
            if is_count_used
            else None
        ),
    )


def _prepare_grammar(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> GrammarMaskTensors | None:
    constrained = [
        (index, row.grammar) for index, row in enumerate(rows) if row.grammar is not None
    ]
    if not constrained:
        return None
    bitmask = allocate_bitmask(len(constrained), vocab_size)
    fill_bitmasks([grammar for _, grammar in constrained], bitmask)
    return GrammarMaskTensors(
        row_indices=torch.tensor([index for index, _ in constrained], dtype=torch.int64).to(device),
        bitmask=bitmask.to(device),
    )


def _effective_top_k(params: SamplingParams, vocab_size: int) -> int:
    return min(params.top_k, vocab_size) if params.top_k > 0 else vocab_size


def _prepare_top_p(
    random_rows: Sequence[SamplingRow], top_ks: Sequence[int], vocab_size: int, device: torch.device
) -> TopPTensors | None:
    positions = [position for position, row in enumerate(random_rows) if row.params.top_p < 1.0]
    if not positions:
        return None
    return TopPTensors(
        positions=torch.tensor(positions, dtype=torch.int64).to(device),
        is_every_row=len(positions) == len(random_rows),
        top_ps=torch.tensor(
            [random_rows[position].params.top_p for position in positions], dtype=torch.float32
        ).to(device),
        num_candidates=max(top_ks[position] for position in positions),
    )


def _prepare_random(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> RandomSamplingTensors | None:
    random_indices = [index for index, row in enumerate(rows) if not row.params.is_greedy]
    if not random_indices:
        return None
    random_rows = [rows[index] for index in random_indices]
    top_ks = [_effective_top_k(row.params, vocab_size) for row in random_rows]
    active_top_ks = [top_k for top_k in top_ks if top_k < vocab_size]
    is_min_p_used = any(row.params.min_p > 0.0 for row in random_rows)
    # One host→device copy; top-k values are small integers, exact in float32.
    values = torch.tensor(
        [
            (row.params.temperature, float(top_k), row.params.min_p)
            for row, top_k in zip(random_rows, top_ks, strict=True)
        ],
        dtype=torch.float32,
    ).to(device)
    return RandomSamplingTensors(
        row_indices=torch.tensor(random_indices, dtype=torch.int64).to(device),
        is_every_row=len(random_rows) == len(rows),
        temperatures=values[:, 0],
        top_ks=values[:, 1].to(torch.int64) if active_top_ks else None,
        max_top_k=max(active_top_ks, default=vocab_size),
        is_top_k_every_row=len(active_top_ks) == len(random_rows),
        top_p=_prepare_top_p(random_rows, top_ks, vocab_size, device),
        min_ps=values[:, 2] if is_min_p_used else None,
        generators=tuple(row.generator for row in random_rows),
    )


def prepare_sampling_batch(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device | str
) -> SamplingBatch:
    """Build one step's sampling tensors; Python work is O(rows + their tokens + biases).

    Penalties come from each row's ``PenaltyState`` (O(vocab) a penalized row), grammar masks
    from each constrained row's matcher (O(vocab / 32) words a row); min_tokens
    stop ids are read only for rows still under ``min_tokens``. ``logit_bias`` ids outside
    ``0..vocab_size-1`` raise ``ValueError``.
    """
    if not rows:
        raise ValueError("a sampling batch needs at least one row")
    device = torch.device(device)
    num_logprobs = tuple(row.params.logprobs for row in rows)
    logprob_rows = [index for index, count in enumerate(num_logprobs) if count is not None]
    return SamplingBatch(
        num_rows=len(rows),
        vocab_size=vocab_size,
        logit_bias=_prepare_logit_bias(rows, vocab_size, device),
        suppressed_tokens=_prepare_suppressed_tokens(rows, vocab_size, device),
        penalties=_prepare_penalties(rows, device),
        grammar=_prepare_grammar(rows, vocab_size, device),
        random=_prepare_random(rows, vocab_size, device),
        num_logprobs=num_logprobs,
        logprob_row_indices=(
            torch.tensor(logprob_rows, dtype=torch.int64).to(device) if logprob_rows else None
        ),
        max_num_logprobs=max((count or 0 for count in num_logprobs), default=0),
    )
