"""``sample``: one step's next tokens for a batch of logits rows, vectorized over the batch.

Per row, in vLLM's order: logit_bias is added; while ``min_tokens`` is not reached, EOS and
``stop_token_ids`` become ``-inf``; the repetition penalty (prompt and output tokens: positive
logits divided, negative multiplied) and the frequency/presence penalties (output tokens only,
OpenAI's ``count * frequency + (count > 0) * presence`` subtracted) apply; a grammar row's
tokens outside its grammar become ``-inf``. Those are the
*processed logits*: greedy rows take their argmax (ties → lowest id) and logprobs are their
log-softmax. NOTE: that differs from vLLM's default ("raw" logprobs, before any processing) so
that a forced or suppressed token's logprob matches what the model was allowed to do, and from
vLLM's "processed" mode (after temperature) so logprobs do not depend on the temperature.

Other rows are divided by their temperature, filtered by top-k (ties with the k-th logit are
kept), top-p (the smallest most-likely set with mass >= top_p, never empty) and min-p (tokens
with probability < min_p × the top probability dropped), then sampled with the exponential
race ``argmax(probs / q)``, ``q ~ Exp(1)`` per token. When every such row has a top-k, all of
that runs on the (rows, max top-k) candidates instead of the whole vocabulary.

A seeded row draws its ``q`` from its own generator, one vocab-sized draw per step indexed by
token id, so its tokens do not depend on the batch around it (up to float rounding between the
candidates path and the whole-vocabulary path, which only matters on an exact near-tie).
"""

from __future__ import annotations

import attrs
import torch

from metrale_server.sampling.logprobs import (
    LogprobTensors,
    TokenLogprobs,
    compute_logprob_tensors,
    unpack_logprobs,
)
from metrale_server.sampling.params import SamplingParams
from metrale_server.sampling.tensors import (
    PenaltyTensors,
    RandomSamplingTensors,
    SamplingBatch,
    SparseLogitUpdate,
    TopPTensors,
)
from metrale_server.structured import apply_bitmask_

_TINY = torch.finfo(torch.float32).tiny


@attrs.frozen(kw_only=True)
class SamplerOutput:
    """One step's result on the host: a token per row, logprobs for the rows that asked."""

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs | None, ...]


def _apply_sparse(logits: torch.Tensor, update: SparseLogitUpdate, *, accumulate: bool) -> None:
    logits.index_put_((update.row_indices, update.token_ids), update.values, accumulate=accumulate)


def _apply_penalties(logits: torch.Tensor, penalties: PenaltyTensors) -> None:
    rows = logits.index_select(0, penalties.row_indices)  # (penalty_rows, vocab)
    if penalties.seen_token_mask is not None:
        repetition = penalties.repetition_penalties[:, None]
        penalized = torch.where(rows > 0, rows / repetition, rows * repetition)
        rows = torch.where(penalties.seen_token_mask, penalized, rows)
    if penalties.output_token_counts is not None:
        counts = penalties.output_token_counts
        rows = rows - penalties.frequency_penalties[:, None] * counts
        rows = rows - penalties.presence_penalties[:, None] * (counts > 0).to(rows.dtype)
    logits.index_copy_(0, penalties.row_indices, rows)


def _apply_top_k(logits: torch.Tensor, top_ks: torch.Tensor, max_top_k: int) -> None:
    top_values = logits.topk(max_top_k, dim=-1).values  # (rows, max_top_k)
    thresholds = top_values.gather(1, (top_ks.clamp(max=max_top_k) - 1)[:, None])
    # Rows without top-k carry k = vocab > max_top_k: nothing to drop.
    thresholds.masked_fill_(top_ks[:, None] > max_top_k, float("-inf"))
    logits.masked_fill_(logits < thresholds, float("-inf"))


def _mask_outside_nucleus(sorted_logits: torch.Tensor, top_ps: torch.Tensor) -> None:
    """In place, on rows sorted in descending order."""
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # The top token has 0 mass before it and top_p > 0: the nucleus is never empty.
    sorted_logits.masked_fill_(mass_before >= top_ps[:, None], float("-inf"))


def _apply_top_p_sorted(sorted_logits: torch.Tensor, top_p: TopPTensors) -> None:
    if top_p.is_every_row:
        _mask_outside_nucleus(sorted_logits, top_p.top_ps)
        return
    nucleus_rows = sorted_logits.index_select(0, top_p.positions)
    _mask_outside_nucleus(nucleus_rows, top_p.top_ps)
    sorted_logits.index_copy_(0, top_p.positions, nucleus_rows)


def _top_p_filtered(logits: torch.Tensor, top_p: TopPTensors) -> torch.Tensor:
    """``logits`` (top-p rows, vocab) with every token outside each row's nucleus at -inf."""
    if top_p.num_candidates < logits.shape[1]:
        sorted_logits, sorted_token_ids = logits.topk(top_p.num_candidates, dim=-1)
    else:
        sorted_logits, sorted_token_ids = logits.sort(dim=-1, descending=True)
    _mask_outside_nucleus(sorted_logits, top_p.top_ps)
    filtered = torch.full_like(logits, float("-inf"))
    return filtered.scatter_(1, sorted_token_ids, sorted_logits)


def _probs_after_min_p(logits: torch.Tensor, min_ps: torch.Tensor | None) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    if min_ps is not None:
        thresholds = min_ps[:, None] * probs.amax(dim=-1, keepdim=True)
        probs.masked_fill_(probs < thresholds, 0.0)
    return probs


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(rows, vocab) probabilities one request's sampling draws from at each row: temperature,
    top-k, top-p and min-p exactly as ``sample`` applies them, renormalized (speculative
    decoding checks drafts against these)."""
    num_rows, vocab_size = logits.shape
    rows = logits.float() / params.temperature
    if 0 < params.top_k < vocab_size:
        top_ks = torch.full((num_rows,), params.top_k, device=rows.device)
        _apply_top_k(rows, top_ks, params.top_k)
    if params.top_p < 1.0:
        sorted_rows, order = rows.sort(dim=-1, descending=True)
        top_ps = torch.full((num_rows,), params.top_p, device=rows.device)
        _mask_outside_nucleus(sorted_rows, top_ps)
        rows = torch.full_like(rows, float("-inf")).scatter_(1, order, sorted_rows)
    min_ps = (
        torch.full((num_rows,), params.min_p, device=rows.device) if params.min_p > 0.0 else None
    )
    probs = _probs_after_min_p(rows, min_ps)
    return probs / probs.sum(dim=-1, keepdim=True)


def _exponential_noise(
    probs: torch.Tensor,
    random: RandomSamplingTensors,
    generator: torch.Generator | None,
    *,
    vocab_size: int,
    token_ids: torch.Tensor | None,
) -> torch.Tensor:
    """``q ~ Exp(1)`` for each entry of ``probs``, whose columns are the tokens ``token_ids``
    (rows, columns), or the whole vocabulary when ``None``.

    Drawn as ``-log(u)``, ``u ~ U[0, 1)``: the law of ``exponential_``, faster on CPU. A seeded
    row always draws one vocab-sized row from its generator and reads its tokens' entries, so
    its noise per token id does not depend on the rest of the batch.
    """
    uniform = torch.empty_like(probs).uniform_(generator=generator)
    for position, row_generator in enumerate(random.generators):
        if row_generator is None:
            continue
        row = torch.empty(vocab_size, device=probs.device).uniform_(generator=row_generator)
        uniform[position] = row if token_ids is None else row[token_ids[position]]
    return uniform.log_().neg_().clamp_min_(_TINY)


def _sample_among_top_k(
    logits: torch.Tensor, random: RandomSamplingTensors, generator: torch.Generator | None
) -> torch.Tensor:
    """Every row has a top-k: the whole pipeline runs on the (rows, max_top_k) candidates."""
    assert random.top_ks is not None
    candidates, candidate_token_ids = logits.topk(random.max_top_k, dim=-1)  # descending
    candidates.div_(random.temperatures[:, None])
    thresholds = candidates.gather(1, (random.top_ks - 1)[:, None])
    candidates.masked_fill_(candidates < thresholds, float("-inf"))
    if random.top_p is not None:
        _apply_top_p_sorted(candidates, random.top_p)
    probs = _probs_after_min_p(candidates, random.min_ps)
    noise = _exponential_noise(
        probs, random, generator, vocab_size=logits.shape[1], token_ids=candidate_token_ids
    )
    choices = probs.div_(noise).argmax(dim=-1, keepdim=True)
    return candidate_token_ids.gather(1, choices)[:, 0]


def _sample_full_vocab(
    rows: torch.Tensor, random: RandomSamplingTensors, generator: torch.Generator | None
) -> torch.Tensor:
    """Overwrites ``rows``, the processed logits of ``random``'s rows."""
    rows.div_(random.temperatures[:, None])
    if random.top_ks is not None:
        _apply_top_k(rows, random.top_ks, random.max_top_k)
    top_p = random.top_p
    if top_p is not None and top_p.is_every_row:
        rows = _top_p_filtered(rows, top_p)
    elif top_p is not None:
        nucleus = _top_p_filtered(rows.index_select(0, top_p.positions), top_p)
        rows.index_copy_(0, top_p.positions, nucleus)
    probs = _probs_after_min_p(rows, random.min_ps)
    noise = _exponential_noise(probs, random, generator, vocab_size=rows.shape[1], token_ids=None)
    return probs.div_(noise).argmax(dim=-1)


def _sample_random_rows(
    logits: torch.Tensor,
    random: RandomSamplingTensors,
    generator: torch.Generator | None,
    *,
    is_owned: bool,
) -> torch.Tensor:
    """Token ids (random_rows,) for the rows in ``random.row_indices`` of ``logits``.

    ``logits`` is only overwritten when ``is_owned``.
    """
    if random.is_every_row:
        rows = logits
    else:
        rows = logits.index_select(0, random.row_indices)
        is_owned = True
    if random.is_top_k_every_row:
        return _sample_among_top_k(rows, random, generator)
    return _sample_full_vocab(rows if is_owned else rows.clone(), random, generator)


def _to_host(
    token_ids: torch.Tensor, logprobs: LogprobTensors | None, batch: SamplingBatch
) -> SamplerOutput:
    if logprobs is None:
        return SamplerOutput(token_ids=tuple(token_ids.tolist()), logprobs=(None,) * batch.num_rows)
    # One device→host copy: every value as float64 (token ids are exact below 2**53).
    parts = (token_ids, logprobs.chosen_logprobs, logprobs.top_token_ids, logprobs.top_logprobs)
    packed = torch.cat([part.to(torch.float64).flatten() for part in parts]).tolist()
    num_asking = logprobs.chosen_logprobs.shape[0]
    width = batch.max_num_logprobs
    top_start = batch.num_rows + num_asking
    top_size = num_asking * width
    top_token_ids = packed[top_start : top_start + top_size]
    top_logprobs = packed[top_start + top_size :]
    return SamplerOutput(
        token_ids=tuple(int(token_id) for token_id in packed[: batch.num_rows]),
        logprobs=unpack_logprobs(
            batch.num_logprobs,
            packed[batch.num_rows : top_start],
            [top_token_ids[i * width : (i + 1) * width] for i in range(num_asking)],
            [top_logprobs[i * width : (i + 1) * width] for i in range(num_asking)],
        ),
    )


def sample(
    logits: torch.Tensor, batch: SamplingBatch, *, generator: torch.Generator | None = None
) -> SamplerOutput:
    """Next token per row of ``logits`` (num_rows, vocab_size), any float dtype, not modified.

    ``generator`` draws the noise of unseeded rows (the global RNG of ``logits``' device when
    ``None``); seeded rows use their own. One device→host transfer per call.
    """
    if tuple(logits.shape) != (batch.num_rows, batch.vocab_size):
        raise ValueError(
            f"logits shape {tuple(logits.shape)} does not match the sampling batch "
            f"({batch.num_rows}, {batch.vocab_size})"
        )
    is_owned = batch.has_logit_processors or logits.dtype != torch.float32
    logits = logits.to(torch.float32, copy=is_owned)
    if batch.logit_bias is not None:
        _apply_sparse(logits, batch.logit_bias, accumulate=True)
    if batch.suppressed_tokens is not None:
        _apply_sparse(logits, batch.suppressed_tokens, accumulate=False)
    if batch.penalties is not None:
        _apply_penalties(logits, batch.penalties)
    if batch.grammar is not None:
        apply_bitmask_(logits, batch.grammar.bitmask, batch.grammar.row_indices)

    # Greedy ids and logprobs read the processed logits before sampling may overwrite them.
    random = batch.random
    greedy_ids = None if random is not None and random.is_every_row else logits.argmax(dim=-1)
    row_logprobs = None
    if batch.logprob_row_indices is not None:
        row_logprobs = logits.index_select(0, batch.logprob_row_indices).log_softmax(dim=-1)
    if random is None:
        assert greedy_ids is not None
        token_ids = greedy_ids
    else:
        sampled = _sample_random_rows(logits, random, generator, is_owned=is_owned)
        token_ids = (
            sampled
            if greedy_ids is None
            else greedy_ids.index_copy_(0, random.row_indices, sampled)
        )

    logprobs = None
    if row_logprobs is not None:
        assert batch.logprob_row_indices is not None
        logprobs = compute_logprob_tensors(
            row_logprobs,
            token_ids.index_select(0, batch.logprob_row_indices),
            batch.max_num_logprobs,
        )
    return _to_host(token_ids, logprobs, batch)
