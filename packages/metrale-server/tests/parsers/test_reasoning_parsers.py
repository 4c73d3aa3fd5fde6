"""Reasoning parsers: ``<think>`` blocks split whole and streamed, for any split into deltas."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_server.parsers import ReasoningSplit, make_reasoning_parser

# (parser, output, reasoning, content)
RECORDED: list[tuple[str, str, str | None, str | None]] = [
    (
        "qwen3",
        "<think>\nThe user asks 2+2.\n</think>\n\nIt is 4.",
        "The user asks 2+2.",
        "It is 4.",
    ),
    ("qwen3", "It is 4.", None, "It is 4."),
    ("qwen3", "<think>\nStill thinking when cut", "Still thinking when cut", None),
    ("qwen3", "Use </think> tags", None, "Use </think> tags"),
    (
        "deepseek_r1",
        "Hmm, 2+2 is 4.\n</think>\n\nThe answer is 4.",
        "Hmm, 2+2 is 4.",
        "The answer is 4.",
    ),
    ("deepseek_r1", "<think>Short.</think>Done.", "Short.", "Done."),
    ("deepseek_r1", "All reasoning, no end", "All reasoning, no end", None),
    ("deepseek_r1", "日本語で考える</think>答え", "日本語で考える", "答え"),
]


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), RECORDED)
def test_whole_outputs(parser: str, text: str, reasoning: str | None, content: str | None) -> None:
    assert make_reasoning_parser(parser).parse(text) == ReasoningSplit(reasoning, content)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), RECORDED)
def test_streamed_pieces_add_up(
    parser: str, text: str, reasoning: str | None, content: str | None, data: st.DataObject
) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=10))))
    bounds = [0, *cuts, len(text)]
    stream = make_reasoning_parser(parser)
    joined = ["", ""]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    for number, piece in enumerate(pieces):
        delta = stream.feed(piece, is_final=number == len(pieces) - 1)
        joined[0] += delta.reasoning or ""
        joined[1] += delta.content or ""
    assert (joined[0] or None, joined[1] or None) == (reasoning, content)


def test_a_partial_tag_is_held_back() -> None:
    stream = make_reasoning_parser("qwen3")
    assert stream.feed("<thi", is_final=False) == ReasoningSplit("", "")
    assert stream.feed("nk>Plan</th", is_final=False) == ReasoningSplit("Plan", "")


def test_unknown_reasoning_parser() -> None:
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        make_reasoning_parser("gpt_oss")
