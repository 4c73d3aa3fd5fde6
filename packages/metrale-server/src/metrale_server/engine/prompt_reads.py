"""What a step reads from prompt positions besides its sampled rows: prompt logprobs and the
states a pooling request pools.

The runner plans them while it lays out the step (:func:`plan_prompt_reads`, one chunk at a
time), then reads them from the step's final hidden states before any sampled row's logits
are computed (the logprob rows go through the arena's logits buffer a slice at a time).
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from metrale_server.engine.scheduler_step import ScheduledChunk
from metrale_server.engine.sequence import Sequence
from metrale_server.engine.step_result import PromptLogprobs, SampledToken, StepResult
from metrale_server.output.outputs import TokenLogprob
from metrale_server.pooling import PoolingParams


class LogitsHead(Protocol):
    def __call__(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor: ...


@attrs.frozen(kw_only=True)
class PromptRows:
    """Rows ``flat_start ..< flat_start + count`` of the step's hidden states are positions
    ``first_position ..`` of ``seq``'s prompt. For a pooling read, ``continues``: an earlier
    chunk's state carries over (the chunk does not start the prompt); ``finishes``: the chunk
    reaches the prompt's end, so the vector is made."""

    seq: Sequence
    flat_start: int
    first_position: int
    count: int
    continues: bool = False
    finishes: bool = False

    @property
    def flat_slice(self) -> slice:
        return slice(self.flat_start, self.flat_start + self.count)


@attrs.frozen(kw_only=True)
class PromptReads:
    """``logprob_rows``: position ``p``'s state gives prompt token ``p + 1``'s logprob.
    ``pool_rows``: the states an embedding request pools in this step."""

    logprob_rows: tuple[PromptRows, ...] = ()
    pool_rows: tuple[PromptRows, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.logprob_rows and not self.pool_rows


def is_embedding(chunk: ScheduledChunk) -> bool:
    """Whether the chunk's sequence pools hidden states (an embedding), so its last chunk has
    no logits row (a score request's has one: the score is read from its logits)."""
    pooling = chunk.seq.params.pooling
    return pooling is not None and not pooling.is_score


def has_logits_row(chunk: ScheduledChunk) -> bool:
    return bool(chunk.samplers) and not is_embedding(chunk)


def logprob_rows(chunk: ScheduledChunk, flat_start: int) -> PromptRows | None:
    """The chunk's positions whose next prompt token's logprob is still to be computed (a
    recomputation after a preemption does not compute them again)."""
    seq = chunk.seq
    # Forked outputs share the first output's prompt (they recompute it after a preemption).
    if seq.params.prompt_logprobs is None or seq.index:
        return None
    first = max(chunk.start, len(seq.prompt_logprobs))
    stop = min(chunk.start + chunk.num_new_tokens, seq.num_prompt_tokens - 1)
    if first >= stop:
        return None
    return PromptRows(
        seq=seq,
        flat_start=flat_start + first - chunk.start,
        first_position=first,
        count=stop - first,
    )


def pool_rows(chunk: ScheduledChunk, flat_start: int) -> PromptRows | None:
    """The chunk's positions an embedding pools: the last prompt token (in the chunk that
    reaches it), every prompt token (mean) or the first (cls); none but the news that the
    prompt is done for a last chunk with nothing to pool."""
    if not is_embedding(chunk):
        return None
    pooling = chunk.seq.params.pooling
    assert pooling is not None
    start, end = chunk.start, chunk.start + chunk.num_new_tokens
    num_prompt = chunk.seq.num_prompt_tokens
    if pooling.method == "mean":
        first, stop = start, min(end, num_prompt)
    elif pooling.method == "cls":
        first, stop = 0, int(start == 0)
    else:
        first, stop = num_prompt - 1, num_prompt if end >= num_prompt else 0
    finishes = end >= num_prompt
    if first >= stop and not finishes:
        return None
    return PromptRows(
        seq=chunk.seq,
        flat_start=flat_start + first - start,
        first_position=first,
        count=max(stop - first, 0),
        continues=start > 0,
        finishes=finishes,
    )


def pool_state(
    pooling: PoolingParams, rows: torch.Tensor, previous: torch.Tensor | None
) -> torch.Tensor:
    """A pooling sequence's state after ``rows`` (float32 hidden states of its positions, in
    order): mean pooling's running sum, else the state kept (cls: the first, last: the last).

    The sum is float64 and added one position at a time in position order (a cumulative sum),
    so where the chunks of a prompt begin and end, which its batch decides, never changes it.
    """
    if not len(rows):
        assert previous is not None
        return previous
    if pooling.method == "mean":
        terms = rows.double()
        if previous is not None:
            terms = torch.cat([previous[None], terms])
        return terms.cumsum(dim=0)[-1]
    return rows[0] if pooling.method == "cls" else rows[-1]


def pooled_vector(
    pooling: PoolingParams, state: torch.Tensor, num_prompt_tokens: int
) -> torch.Tensor:
    """The embedding of a finished pooling state: the mean's division, ``dimensions``, the
    L2 normalization."""
    vector = (state / num_prompt_tokens).float() if pooling.method == "mean" else state
    if pooling.dimensions is not None:
        vector = vector[: pooling.dimensions]
    if pooling.normalize:
        vector = torch.nn.functional.normalize(vector, p=2.0, dim=0)
    return vector


def pair_score(logits: torch.Tensor, score_token_ids: tuple[int, int]) -> float:
    """A reranker's score from its last token's logits: the softmax over (false, true), the
    true token's share, which is ``sigmoid(logit_true - logit_false)``."""
    false_id, true_id = score_token_ids
    return float(torch.sigmoid(logits[true_id] - logits[false_id]))


def read_prompts(
    hidden: torch.Tensor, reads: PromptReads, head: LogitsHead, logits_buffer: torch.Tensor
) -> StepResult:
    """The prompt logprobs and pooling results of the step's ``reads`` from its final hidden
    states; ``head(rows, out=)`` is the model's logits head, ``logits_buffer`` the arena's
    logits rows it writes into."""
    result = StepResult(
        tokens=[], prompt_logprobs=_prompt_logprobs(hidden, reads, head, logits_buffer)
    )
    for rows in reads.pool_rows:
        seq = rows.seq
        pooling = seq.params.pooling
        assert pooling is not None
        previous = seq.pool_state if rows.continues else None
        state = pool_state(pooling, hidden[rows.flat_slice].float(), previous)
        if not rows.finishes:
            result.pool_states.append((seq, state))
            continue
        vector = pooled_vector(pooling, state, seq.num_prompt_tokens)
        result.tokens.append(SampledToken(seq=seq, token_id=-1, pooled=tuple(vector.tolist())))
    return result


def _prompt_logprobs(
    hidden: torch.Tensor, reads: PromptReads, head: LogitsHead, logits_buffer: torch.Tensor
) -> list[PromptLogprobs]:
    """Each row's log-softmax over the vocabulary, a slice of the arena's logits rows at a
    time (a long prompt's rows never take more memory than the batch's do): the next
    prompt token's logprob and rank, and the most likely tokens."""
    if not reads.logprob_rows:
        return []
    flat: list[int] = []
    targets: list[int] = []
    for rows in reads.logprob_rows:
        flat += range(rows.flat_start, rows.flat_start + rows.count)
        first = rows.first_position + 1
        targets += rows.seq.token_ids[first : first + rows.count]
    num_top = max(rows.seq.params.prompt_logprobs or 0 for rows in reads.logprob_rows)
    chosen: list[float] = []
    ranks: list[int] = []
    top_ids: list[list[int]] = []
    top_values: list[list[float]] = []
    capacity = len(logits_buffer)
    for begin in range(0, len(flat), capacity):
        index = torch.tensor(flat[begin : begin + capacity], device=hidden.device)
        target = torch.tensor(targets[begin : begin + capacity], device=hidden.device)
        logits = head(hidden[index], out=logits_buffer[: len(index)])
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen_part = logprobs.gather(1, target[:, None])
        chosen += chosen_part[:, 0].tolist()
        ranks += ((logprobs > chosen_part).sum(dim=-1) + 1).tolist()
        values, ids = logprobs.topk(num_top, dim=-1)
        top_ids += ids.tolist()
        top_values += values.tolist()
    results: list[PromptLogprobs] = []
    row = 0
    for rows in reads.logprob_rows:
        count = rows.seq.params.prompt_logprobs or 0
        entries = tuple(
            TokenLogprob(
                token_id=targets[i],
                logprob=chosen[i],
                top=tuple(zip(top_ids[i][:count], top_values[i][:count], strict=True)),
                rank=ranks[i],
            )
            for i in range(row, row + rows.count)
        )
        results.append(
            PromptLogprobs(seq=rows.seq, first_position=rows.first_position, entries=entries)
        )
        row += rows.count
    return results
