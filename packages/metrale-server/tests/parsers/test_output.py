"""``Output``: the content whitespace rules every format shares, and content and calls sent
the same however the machines' pieces were cut."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_server.parsers import ParsedToolCalls, ToolCall
from metrale_server.parsers.output import Output
from metrale_server.parsers.reading import Status

from .conftest import cut


@attrs.define
class FakeCall:
    """A ``CallReader`` whose arguments come in given fragments."""

    name: str | None
    fragments: list[str]
    status: Status = Status.PARTIAL
    end: int = 0

    def take_arguments(self, text: str) -> str:
        taken = "".join(self.fragments)
        self.fragments.clear()
        return taken


# An output as the machines hand it over: content strings, and calls (name, fragments).
Event = str | tuple[str, tuple[str, ...]]


def run(events: list[Event]) -> tuple[ParsedToolCalls, str]:
    """The whole result, and the content as streamed."""
    out = Output()
    streamed = ""
    for event in events:
        if isinstance(event, str):
            out.content(event)
        else:
            name, fragments = event
            call = FakeCall(name=name, fragments=[])
            for fragment in fragments:
                call.fragments.append(fragment)
                out.follow(call, "")
            if not fragments:
                out.follow(call, "")
            out.close_call()
        streamed += out.take().content
    out.finish()
    streamed += out.take().content
    return out.result(), streamed


CALL = ("f", ("{}",))


@pytest.mark.parametrize(
    ("events", "content"),
    [
        (["  Hello\n\n"], "  Hello\n\n"),  # no call: unchanged
        ([" \n ", "\t"], None),  # whitespace only
        ([], None),
        (["  Hello\n\n", CALL], "  Hello"),  # before a call: trailing whitespace dropped
        ([CALL, "\n\n  Bye  \n"], "Bye"),  # after a call: stripped
        (["A ", CALL, " B ", CALL, " C "], "A\nB\nC"),  # runs joined by a newline
        (["\n", CALL, "\n", CALL, "B"], "B"),
        ([CALL, " ", "x", " ", "y", " "], "x y"),
    ],
)
def test_content_whitespace(events: list[Event], content: str | None) -> None:
    result, streamed = run(events)
    assert result.content == content
    assert streamed == (content or "")


def test_calls_and_fragments() -> None:
    result, _ = run([("f", ("{", '"a": 1', "}")), ("g", ())])
    assert result.calls == (ToolCall("f", '{"a": 1}'), ToolCall("g", ""))


def test_a_call_is_announced_once_with_its_first_fragment() -> None:
    out = Output()
    call = FakeCall(name="f", fragments=["{"])
    out.follow(call, "")
    call.fragments.append("}")
    out.follow(call, "")
    [delta] = out.take().calls
    assert (delta.index, delta.name, delta.arguments) == (0, "f", "{}")
    out.close_call()
    second = FakeCall(name="g", fragments=[])
    out.follow(second, "")
    [announced] = out.take().calls
    assert (announced.index, announced.name, announced.arguments) == (1, "g", "")


def test_a_dropped_call_leaves_the_content_run_whole() -> None:
    out = Output()
    out.content("A  ")
    out.follow(FakeCall(name="f", fragments=["{"]), "")
    out.drop_call()
    out.content("<broken>")
    out.finish()
    assert out.result() == ParsedToolCalls(content="A  <broken>", calls=())


pieces = st.text(alphabet=st.sampled_from(list("ab \n\t")), max_size=8)
events = st.lists(st.one_of(pieces, st.just(CALL)), max_size=8)


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), whole=events)
def test_any_cut_of_the_content_gives_the_same_output(
    data: st.DataObject, whole: list[Event]
) -> None:
    recut: list[Event] = []
    for event in whole:
        if isinstance(event, str):
            recut.extend(cut(event, data.draw(st.lists(st.integers(0, len(event)), max_size=4))))
        else:
            recut.append(event)
    result, streamed = run(whole)
    assert run(recut) == (result, streamed)
    assert streamed == (result.content or "")
    if result.content is not None:
        assert result.content.strip()
