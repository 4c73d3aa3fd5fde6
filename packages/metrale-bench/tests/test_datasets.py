from __future__ import annotations

import json
from pathlib import Path

import pytest

from metrale_bench.datasets import (
    WORDS,
    DatasetError,
    length_range,
    random_requests,
    sharegpt_requests,
    words_for_tokens,
)


@pytest.mark.parametrize(
    ("length", "ratio", "bounds"),
    [(128, 0.0, (128, 128)), (100, 0.5, (50, 150)), (10, 0.25, (7, 13)), (1, 0.9, (1, 2))],
)
def test_length_range(length: int, ratio: float, bounds: tuple[int, int]) -> None:
    assert length_range(length, ratio) == bounds


def test_length_range_refuses_ratio_of_one() -> None:
    with pytest.raises(ValueError, match="range ratio"):
        length_range(10, 1.0)


def test_random_prompts_are_words_with_lengths_in_range() -> None:
    requests = random_requests(
        num_requests=50, input_len=100, output_len=20, range_ratio=0.5, seed=1
    )
    lengths = [len(str(r.prompt).split()) for r in requests]
    assert all(isinstance(r.prompt, str) for r in requests)
    assert all(set(str(r.prompt).split()) <= set(WORDS) for r in requests)
    assert min(lengths) >= 50
    assert max(lengths) <= 150
    assert len(set(lengths)) > 10
    assert all(10 <= r.max_tokens <= 30 for r in requests)
    assert requests == random_requests(
        num_requests=50, input_len=100, output_len=20, range_ratio=0.5, seed=1
    )


def test_random_prompts_are_sized_by_tokens_per_word() -> None:
    (request,) = random_requests(num_requests=1, input_len=64, output_len=8)
    assert len(str(request.prompt).split()) == 64
    assert request.max_tokens == 8
    assert request.prompt[:20] not in repr(request)  # a repr never prints prompts
    (request,) = random_requests(num_requests=1, input_len=64, output_len=8, tokens_per_word=5.5)
    assert len(str(request.prompt).split()) == 12  # round(64 / 5.5)


@pytest.mark.parametrize(
    ("num_tokens", "tokens_per_word", "num_words"),
    [(64, 1.0, 64), (64, 2.0, 32), (10, 3.0, 3), (1, 6.0, 1), (5, 0.5, 10)],
)
def test_words_for_tokens(num_tokens: int, tokens_per_word: float, num_words: int) -> None:
    assert words_for_tokens(num_tokens, tokens_per_word) == num_words


def _sharegpt(path: Path) -> Path:
    entries = [
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "human", "value": "Only one turn"}]},
        {"conversations": [{"from": "human", "value": "What is two plus two?"},
                           {"from": "gpt", "value": "It is four, of course."}]},
        {"conversations": [{"from": "human", "value": "Name a colour please."},
                           {"from": "gpt", "value": "Blue."}]},
        "not an entry",
    ]  # fmt: skip
    path.write_text(json.dumps(entries))
    return path


def test_sharegpt_takes_first_two_turns_and_skips_unusable(tmp_path: Path) -> None:
    requests = sharegpt_requests(_sharegpt(tmp_path / "s.json"), num_requests=2, seed=0)
    by_prompt = {r.prompt: r.max_tokens for r in requests}
    # 22 characters of reply → ceil(22 / 4) = 6 tokens; 5 characters → 2.
    assert by_prompt == {"What is two plus two?": 6, "Name a colour please.": 2}


def test_sharegpt_fixed_output_len(tmp_path: Path) -> None:
    requests = sharegpt_requests(
        _sharegpt(tmp_path / "s.json"), num_requests=2, output_len=32, seed=5
    )
    assert [r.max_tokens for r in requests] == [32, 32]


def test_sharegpt_too_few_entries(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="2 usable conversations, 3 requested"):
        sharegpt_requests(_sharegpt(tmp_path / "s.json"), num_requests=3)


def test_sharegpt_not_a_list(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"conversations": []}')
    with pytest.raises(DatasetError, match="JSON list"):
        sharegpt_requests(path, num_requests=1)
