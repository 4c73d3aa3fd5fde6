"""``MachineToolCallParser``: one format machine serves both whole and streamed parsing.

A format's machine reads the text so far from where it stopped, hands what it has decided to
an ``Output`` and keeps whatever it cannot decide yet (text that may be the start of a
marker, a call not complete) for the next ``advance``. ``parse`` runs a fresh machine over
the whole text at once; ``feed`` runs the stream's machine over the text so far. Both see
the same decisions, so the stream adds up to the whole result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from metrale_server.parsers.output import Output
from metrale_server.parsers.tool_calls import ParsedToolCalls, StreamDelta


class Machine(Protocol):
    def advance(self, text: str, *, is_final: bool, out: Output) -> None:
        """Reads ``text`` (the previous text plus what was added) as far as it can be
        decided; with ``is_final`` all of it, leaving no call open."""


class MachineToolCallParser(ABC):
    """Base of the tool-call parsers; one instance per output."""

    def __init__(self) -> None:
        self._text = ""
        self._machine = self.new_machine()
        self._out = Output()
        self._is_finished = False

    @abstractmethod
    def new_machine(self) -> Machine: ...

    def parse(self, text: str) -> ParsedToolCalls:
        out = Output()
        self.new_machine().advance(text, is_final=True, out=out)
        out.finish()
        return out.result()

    def feed(self, delta: str, *, is_final: bool) -> StreamDelta:
        if self._is_finished:
            raise ValueError("this output's stream already ended (is_final was set)")
        self._text += delta
        self._machine.advance(self._text, is_final=is_final, out=self._out)
        if is_final:
            self._out.finish()
            self._is_finished = True
        return self._out.take()
