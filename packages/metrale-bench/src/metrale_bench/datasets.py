"""Benchmark prompts: ``random`` (vLLM's random dataset, with a range ratio) and ShareGPT JSON.

Random prompts are text, random words from ``WORDS``, so every server and tokenizer accepts
them whatever its vocabulary (like vLLM's, whose random token ids are decoded to text before
they are sent). The bench has no tokenizer: a prompt of N tokens is N / ``tokens_per_word``
words, the ratio measured once on the server's ``/tokenize`` when it has one (see
``benchmarks.common.identify``), else 1 (these words are one token each in the byte-level BPE
vocabularies of common models). Lengths are right on average, not exactly per prompt; the
recorded counts are the server's ``usage`` either way.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

import attrs

# Common English words that byte-level BPE vocabularies hold as one token each (with their
# leading space), so N words make about N tokens.
_WORD_TEXT = (
    "the time people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city name president team minute idea kid body "
    "back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education"
)
WORDS = tuple(_WORD_TEXT.split())
# ShareGPT completions are measured in characters when no output length is given: about four
# characters per token in English.
CHARS_PER_TOKEN = 4


class DatasetError(ValueError):
    """A dataset file that cannot be read as the format it claims."""


@attrs.frozen(kw_only=True)
class BenchRequest:
    """One prompt and how many tokens to ask for. ``prompt`` is text or token ids (token ids
    go only to the completions endpoint)."""

    prompt: str | tuple[int, ...]
    max_tokens: int

    def __repr__(self) -> str:
        return f"BenchRequest(<{_prompt_size(self.prompt)}>, max_tokens={self.max_tokens})"


def _prompt_size(prompt: str | tuple[int, ...]) -> str:
    return f"{len(prompt)} chars" if isinstance(prompt, str) else f"{len(prompt)} token ids"


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """vLLM's random-dataset bounds: ``[floor(L·(1−r)), ceil(L·(1+r))]``, at least 1."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range ratio must be in [0, 1), got {range_ratio}")
    if length < 1:
        raise ValueError(f"length must be at least 1, got {length}")
    low = max(1, math.floor(length * (1 - range_ratio)))
    return low, max(low, math.ceil(length * (1 + range_ratio)))


def random_text(num_words: int, rng: random.Random) -> str:
    """``num_words`` words drawn from ``WORDS`` (about as many tokens)."""
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def random_requests(
    *,
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    tokens_per_word: float = 1.0,
) -> list[BenchRequest]:
    """``num_requests`` text prompts with input and output lengths in tokens drawn uniformly
    from :func:`length_range`; a prompt of N tokens is :func:`words_for_tokens` words. Same
    seed and ratio, same requests."""
    rng = random.Random(seed)
    input_bounds = length_range(input_len, range_ratio)
    output_bounds = length_range(output_len, range_ratio)
    requests = []
    for _ in range(num_requests):
        num_words = words_for_tokens(rng.randint(*input_bounds), tokens_per_word)
        prompt = random_text(num_words, rng)
        requests.append(BenchRequest(prompt=prompt, max_tokens=rng.randint(*output_bounds)))
    return requests


def words_for_tokens(num_tokens: int, tokens_per_word: float) -> int:
    """How many ``WORDS`` make about ``num_tokens`` tokens (at least one)."""
    if tokens_per_word <= 0:
        raise ValueError(f"tokens per word must be positive, got {tokens_per_word}")
    return max(1, round(num_tokens / tokens_per_word))


def sharegpt_requests(
    path: Path,
    *,
    num_requests: int,
    output_len: int | None = None,
    seed: int = 0,
    min_prompt_chars: int = 4,
) -> list[BenchRequest]:
    """Conversations from a ShareGPT-format JSON file (a list of ``{"conversations": [{"from",
    "value"}, …]}``): the first turn is the prompt, the second the reference completion.

    Entries are shuffled with ``seed`` and taken in that order; those with fewer than two turns
    or a prompt under ``min_prompt_chars`` are skipped. ``max_tokens`` is ``output_len`` when
    given, else the reference completion's length estimated at ``CHARS_PER_TOKEN`` characters
    per token. Raises :class:`DatasetError` when the file holds fewer usable entries than asked.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise DatasetError(f"{path}: {error}") from error
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a ShareGPT file holds a JSON list")
    order = list(range(len(data)))
    random.Random(seed).shuffle(order)
    requests: list[BenchRequest] = []
    for index in order:
        if len(requests) == num_requests:
            break
        turns = _turns(data[index])
        if turns is None or len(turns[0]) < min_prompt_chars:
            continue
        prompt, completion = turns
        max_tokens = output_len or max(1, math.ceil(len(completion) / CHARS_PER_TOKEN))
        requests.append(BenchRequest(prompt=prompt, max_tokens=max_tokens))
    if len(requests) < num_requests:
        raise DatasetError(
            f"{path}: {len(requests)} usable conversations, {num_requests} requested"
        )
    return requests


def _turns(entry: object) -> tuple[str, str] | None:
    if not isinstance(entry, dict):
        return None
    conversation = entry.get("conversations", entry.get("conversation"))
    if not isinstance(conversation, Sequence) or len(conversation) < 2:
        return None
    values = [turn.get("value") if isinstance(turn, dict) else None for turn in conversation[:2]]
    if not all(isinstance(value, str) for value in values):
        return None
    return str(values[0]), str(values[1])
