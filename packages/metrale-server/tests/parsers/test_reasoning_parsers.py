"""Reasoning parsers: ``<think>`` blocks split whole and streamed, for any split into deltas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_server.parsers import (
    REASONING_PARSER_NAMES,
    REASONING_PARSERS,
    ReasoningParser,
    ReasoningSplit,
    make_reasoning_parser,
)

from .conftest import deltas

# (parser, output, reasoning, content)
RECORDED: dict[str, tuple[str, str, str | None, str | None]] = {
    "qwen3-thinks": (
        "qwen3",
        "<think>\nThe user asks 2+2.\n</think>\n\nIt is 4.",
        "The user asks 2+2.",
        "It is 4.",
    ),
    "qwen3-thinking-off": ("qwen3", "It is 4.", None, "It is 4."),
    "qwen3-empty-think": ("qwen3", "<think>\n\n</think>\n\nHi!\n", None, "Hi!\n"),
    "qwen3-whitespace-first": ("qwen3", "\n<think>a  b</think>c", "a  b", "c"),
    "qwen3-cut-short": (
        "qwen3",
        "<think>\nStill thinking when cut",
        "Still thinking when cut",
        None,
    ),
    "qwen3-close-without-open": ("qwen3", "Use </think> tags", None, "Use </think> tags"),
    "qwen3-not-the-tag": ("qwen3", "<thinking> is no tag", None, "<thinking> is no tag"),
    "qwen3-unicode": ("qwen3", "<think>考虑一下 🤔</think>答案是 4", "考虑一下 🤔", "答案是 4"),
    "qwen3-cut-inside-the-open-tag": ("qwen3", "<thi", None, "<thi"),
    "qwen3-empty": ("qwen3", "", None, None),
    "deepseek-prompt-opened-think": (
        "deepseek_r1",
        "Hmm, 2+2 is 4.\n</think>\n\nThe answer is 4.",
        "Hmm, 2+2 is 4.",
        "The answer is 4.",
    ),
    "deepseek-writes-think": ("deepseek_r1", "<think>Short.</think>Done.", "Short.", "Done."),
    "deepseek-never-closes": (
        "deepseek_r1",
        "All reasoning, no end",
        "All reasoning, no end",
        None,
    ),
    "deepseek-unicode": ("deepseek_r1", "日本語で考える</think>答え", "日本語で考える", "答え"),
    "deepseek-no-reasoning": ("deepseek_r1", "</think>\n\nOnly content", None, "Only content"),
    "deepseek-think-later": ("deepseek_r1", "a <think> b</think>c", "a <think> b", "c"),
    "deepseek-cut-inside-the-close-tag": ("deepseek_r1", "Almost </thi", "Almost </thi", None),
    "deepseek-empty": ("deepseek_r1", "", None, None),
}


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "content"), RECORDED.values(), ids=RECORDED
)
def test_whole_outputs(parser: str, text: str, reasoning: str | None, content: str | None) -> None:
    assert make_reasoning_parser(parser).parse(text) == ReasoningSplit(reasoning, content)


def stream(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    joined = ["", ""]
    pieces = pieces or [""]
    for number, piece in enumerate(pieces):
        delta = parser.feed(piece, is_final=number == len(pieces) - 1)
        assert isinstance(delta.reasoning, str)
        assert isinstance(delta.content, str)
        joined[0] += delta.reasoning
        joined[1] += delta.content
    return joined[0], joined[1]


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "content"), RECORDED.values(), ids=RECORDED
)
def test_streamed_pieces_add_up(
    parser: str, text: str, reasoning: str | None, content: str | None, data: st.DataObject
) -> None:
    pieces = data.draw(deltas(text))
    assert stream(make_reasoning_parser(parser), pieces) == (reasoning or "", content or "")


pieces = st.sampled_from(["<think>", "</think>", "<thi", "</th", " ", "\n", "a", "b c", "思"])


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), parts=st.lists(pieces, max_size=10))
@pytest.mark.parametrize("parser", REASONING_PARSER_NAMES)
def test_random_outputs(parser: str, data: st.DataObject, parts: list[str]) -> None:
    text = "".join(parts)
    split = make_reasoning_parser(parser).parse(text)
    for part in (split.reasoning, split.content):
        assert part is None or (part and not part[0].isspace())
    if split.reasoning is not None:
        assert not split.reasoning[-1].isspace()
    streamed = stream(make_reasoning_parser(parser), data.draw(deltas(text)))
    assert streamed == (split.reasoning or "", split.content or "")


def test_reasoning_streams_as_it_is_written() -> None:
    parser = make_reasoning_parser("qwen3")
    assert parser.feed("<thi", is_final=False) == ReasoningSplit("", "")
    assert parser.feed("nk>\nPlan", is_final=False) == ReasoningSplit("Plan", "")
    assert parser.feed(" more  ", is_final=False) == ReasoningSplit(" more", "")
    assert parser.feed("</th", is_final=False) == ReasoningSplit("", "")
    assert parser.feed("ink>\n\nIt", is_final=False) == ReasoningSplit("", "It")
    assert parser.feed(" is 4.\n", is_final=True) == ReasoningSplit("", " is 4.\n")


def test_qwen3_without_think_is_content_from_the_start() -> None:
    parser = make_reasoning_parser("qwen3")
    assert parser.feed("It", is_final=False) == ReasoningSplit("", "It")
    assert parser.feed(" is </think> 4", is_final=True) == ReasoningSplit("", " is </think> 4")


def test_nothing_may_be_fed_after_the_final_delta() -> None:
    parser = make_reasoning_parser("deepseek_r1")
    parser.feed("done", is_final=True)
    with pytest.raises(ValueError, match="already ended"):
        parser.feed("more", is_final=True)


def test_the_registry() -> None:
    assert REASONING_PARSER_NAMES == ("deepseek_r1", "qwen3") == tuple(REASONING_PARSERS)
    assert make_reasoning_parser("qwen3") is not make_reasoning_parser("qwen3")


@pytest.mark.parametrize("name", ["gpt_oss", "", "hermes"])
def test_an_unknown_parser_names_the_choices(name: str) -> None:
    with pytest.raises(ValueError, match="choose one of deepseek_r1, qwen3") as e:
        make_reasoning_parser(name)
    assert repr(name) in str(e.value)
