"""Pieces of the sampled-distribution tests of speculative decoding: a byte-level tokenizer
for a 258-token vocabulary, the successor cycles a chain model follows, the patterns its
sampled continuations make, and a two-sample chi-square test of homogeneity over them."""

from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

BYTE_VOCAB = 258  # <s>, </s> and the 256 byte-level BPE bytes
Patterns = collections.Counter[tuple[str, ...]]


def save_byte_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer without merges (``<s>`` 0, ``</s>`` 1, the bytes after)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<s>": 0, "</s>": 1, **{byte: 2 + i for i, byte in enumerate(alphabet)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>")])
    backend.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def successor_cycles(vocab_size: int, cycle: int, generator: torch.Generator) -> torch.Tensor:
    """``successor[token]``: the tokens, shuffled, in cycles of ``cycle`` (the last one longer)."""
    import torch

    order = torch.randperm(vocab_size, generator=generator)
    successor = torch.empty(vocab_size, dtype=torch.int64)
    num_cycles = vocab_size // cycle
    for index in range(num_cycles):
        end = vocab_size if index == num_cycles - 1 else (index + 1) * cycle
        members = order[index * cycle : end]
        successor[members] = members.roll(-1)
    return successor


def chain_patterns(
    llm: Any, prompt: list[int], successor: Sequence[int], params: Sequence[Any]
) -> Patterns:
    """``llm`` (a ``metrale_server.LLM``) continues ``prompt`` once for each of ``params``
    (``SamplingParams`` with ``max_tokens`` each): how often each pattern came out of where
    token j is its predecessor's successor ("chain"), else the successor's successor ("skip":
    a draft or a row one position off lands there), else a token of the prompt ("prompt"),
    else any other ("other") (the first token's predecessor: the prompt's last)."""
    outputs = llm.generate([{"prompt_token_ids": prompt}] * len(params), list(params))
    in_prompt = set(prompt)
    patterns: Patterns = collections.Counter()
    for output, request in zip(outputs, params, strict=True):
        tokens = [prompt[-1], *output.outputs[0].token_ids]
        assert len(tokens) == 1 + request.max_tokens
        patterns[
            tuple(_step(a, b, successor, in_prompt) for a, b in itertools.pairwise(tokens))
        ] += 1
    return patterns


def _step(a: int, b: int, successor: Sequence[int], in_prompt: set[int]) -> str:
    if b == successor[a]:
        return "chain"
    if b == successor[successor[a]]:
        return "skip"
    return "prompt" if b in in_prompt else "other"


def two_sample_p_value(
    first: Patterns, second: Patterns, *, min_category: int = 10, min_degrees: int = 5
) -> float:
    """Chi-square test of homogeneity of two samples; the categories seen fewer than
    ``min_category`` times in both together are pooled into one (asserts at least
    ``min_degrees`` degrees of freedom are left, or the test says little)."""
    import torch

    both = first + second
    kept = sorted(s for s, count in both.items() if count >= min_category)
    table = torch.tensor(
        [
            [*(sample[s] for s in kept), sum(sample.values()) - sum(sample[s] for s in kept)]
            for sample in (first, second)
        ],
        dtype=torch.float64,
    )
    # The pool too, if it is as rare (the test then compares the samples given the others:
    # still the same distribution under the null hypothesis); every expected count is >= 5
    # for samples of equal size.
    table = table[:, table.sum(0) >= min_category]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    degrees = table.shape[1] - 1
    assert degrees >= min_degrees, table
    return float(torch.special.gammaincc(torch.tensor(degrees / 2.0), statistic / 2))
