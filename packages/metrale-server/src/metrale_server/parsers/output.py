"""``Output``: what the format machines have decided about an output, as stream deltas and as
the whole result.

The machines hand over content text verbatim, in order, and calls as they are announced,
grow and close. The whitespace of the content is settled here, once for every format:

- The content is the text outside the well-formed calls, cut into runs by those calls.
- The run before the first call keeps its leading whitespace and loses its trailing
  whitespace; each run after a call is stripped; runs that are left non-empty are joined with
  a newline.
- An output without a well-formed call therefore comes back as it is.
- Content that is empty or only whitespace is ``None`` (streamed: nothing is sent).

Streamed, whitespace is held back until what follows it decides whether it is kept, so the
content deltas concatenate to exactly the whole content for any split into deltas. A
malformed call's text is content, in the run it stands in: if its name was streamed already,
that call stays behind as a streamed (partial) call, and the content is still the same.
"""

from __future__ import annotations

from metrale_server.parsers.reading import CallReader, Status
from metrale_server.parsers.tool_calls import (
    ParsedToolCalls,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
)


class Output:
    def __init__(self) -> None:
        self._content: list[str] = []  # sent since the last take
        self._deltas: list[ToolCallDelta] = []  # likewise
        self._all_content: list[str] = []
        self._calls: list[ToolCall] = []  # well-formed calls, closed
        self._has_content = False  # some non-whitespace content was sent
        self._pending = ""  # whitespace held back
        self._after_call = False  # the current run follows a call
        self._run_started = False  # the current run (after a call) has sent text
        self._next_index = 0
        self._open: tuple[int, str, list[str]] | None = None  # index, name, fragments
        self._finished = False

    def content(self, text: str) -> None:
        """Content text, verbatim, in the order of the output."""
        if not text:
            return
        if self._after_call and not self._run_started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._pending += text
            return
        lead = ""
        if self._after_call and not self._run_started:
            self._run_started = True
            lead = "\n" if self._has_content else ""
        self._send(lead + self._pending + body)
        self._pending = text[len(body) :]
        self._has_content = True

    def follow(self, reader: CallReader, text: str) -> None:
        """Announces ``reader``'s call once it has a name, then sends its new argument text.
        A call is closed (``close_call``) or dropped (``drop_call``) by whoever knows that
        what surrounds it is well-formed too."""
        if reader.status is Status.BROKEN or reader.name is None:
            return
        if self._open is None:
            self._open = (self._next_index, reader.name, [])
            self._next_index += 1
            self._deltas.append(ToolCallDelta(index=self._open[0], name=reader.name, arguments=""))
        fragment = reader.take_arguments(text)
        if fragment:
            self._open[2].append(fragment)
            self._deltas.append(ToolCallDelta(index=self._open[0], name=None, arguments=fragment))

    def close_call(self) -> None:
        """The open call is well-formed and complete: it ends the current content run."""
        assert self._open is not None
        _, name, fragments = self._open
        self._calls.append(ToolCall(name=name, arguments="".join(fragments)))
        self._open = None
        self._pending = ""
        self._after_call = True
        self._run_started = False

    def drop_call(self) -> None:
        """The open call, if any, turned out malformed; its text comes as content."""
        self._open = None

    def finish(self) -> None:
        assert self._open is None, "a final reading leaves no call open"
        if not self._calls and self._has_content:
            self._send(self._pending)
        self._pending = ""
        self._finished = True

    def take(self) -> StreamDelta:
        """What was decided since the last take."""
        delta = StreamDelta(content="".join(self._content), calls=_merged(self._deltas))
        self._content.clear()
        self._deltas.clear()
        return delta

    def result(self) -> ParsedToolCalls:
        assert self._finished
        return ParsedToolCalls(content="".join(self._all_content) or None, calls=tuple(self._calls))

    def _send(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._all_content.append(text)


def _merged(deltas: list[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """One delta per call and take: the name (if this take announced it) and the fragments
    joined."""
    merged: list[ToolCallDelta] = []
    for delta in deltas:
        if merged and merged[-1].index == delta.index:
            last = merged[-1]
            merged[-1] = ToolCallDelta(
                index=last.index, name=last.name, arguments=last.arguments + delta.arguments
            )
        else:
            merged.append(delta)
    return tuple(merged)
