"""``tools``, ``tool_choice`` and ``parallel_tool_calls`` → ``ToolRequest``.

``required`` and a named function are enforced by the grammar, as vLLM does: a named choice
constrains the output to that function's arguments (a JSON object of its ``parameters``
schema); ``required`` to a JSON array of ``{"name", "parameters"}`` calls (one at most when
``parallel_tool_calls`` is false). ``auto`` leaves the model free and reads its calls with the
server's ``--tool-call-parser``.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from metrale_server.api.errors import bad_request
from metrale_server.api.fields import Fields, describe
from metrale_server.structured import StructuredOutputsParams

TOOL_CHOICES = ("none", "auto", "required")
# OpenAI's rule for function names.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@attrs.frozen(kw_only=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any] = attrs.field(repr=False)
    template_entry: dict[str, Any] = attrs.field(repr=False)  # as the chat template sees it


@attrs.frozen(kw_only=True)
class ToolRequest:
    """``choice`` is ``none``, ``auto``, ``required`` or ``named`` (then ``named`` is set)."""

    tools: tuple[ToolSpec, ...]
    choice: str
    named: str | None
    is_parallel: bool

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        return [tool.template_entry for tool in self.tools] if self.tools else None

    @property
    def is_parsed(self) -> bool:
        """Whether the output is read for tool calls."""
        return self.choice != "none"

    def grammar(self) -> StructuredOutputsParams | None:
        """The constraint that enforces ``required`` or a named function; else ``None``."""
        if self.choice == "named":
            tool = next(tool for tool in self.tools if tool.name == self.named)
            return StructuredOutputsParams(json=tool.parameters)
        if self.choice != "required":
            return None
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.name]},
                    "parameters": tool.parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for tool in self.tools
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.is_parallel:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema)


NO_TOOLS = ToolRequest(tools=(), choice="none", named=None, is_parallel=True)


def read_tool_request(fields: Fields, *, has_parser: bool) -> ToolRequest:
    """The request's tools; ``auto`` needs the server's tool-call parser (``has_parser``)."""
    tools = _read_tools(fields)
    is_parallel = fields.read_bool("parallel_tool_calls", True)
    value = fields.raw("tool_choice")
    named = None
    if value is None:
        choice = "auto" if tools else "none"
    elif isinstance(value, str):
        if value not in TOOL_CHOICES:
            fields.fail("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a function")
        choice = value
    elif isinstance(value, dict):
        choice, named = "named", _read_named_choice(Fields(value, "tool_choice."), tools)
    else:
        fields.fail("tool_choice", f"expected a string or an object, got {describe(value)}")
    if choice in ("required", "named") and not tools:
        fields.fail("tool_choice", f"{choice!r} needs tools")
    if choice == "auto" and tools and not has_parser:
        fields.fail(
            "tool_choice",
            '"auto" (the default when tools are given) needs the server started with '
            '--tool-call-parser; use "required", a named function or "none" otherwise',
        )
    if not tools:
        choice = "none"
    return ToolRequest(tools=tools, choice=choice, named=named, is_parallel=is_parallel)


def _read_named_choice(choice: Fields, tools: tuple[ToolSpec, ...]) -> str:
    if choice.read_optional_str("type") != "function":
        choice.fail("type", 'must be "function"')
    function = choice.read_object("function")
    choice.refuse_unread()
    name = function.read_optional_str("name")
    function.refuse_unread()
    if name is None:
        function.fail("name", "is required")
    if name not in {tool.name for tool in tools}:
        function.fail("name", f"{name!r} is not one of the request's tools")
    return name


def _read_tools(fields: Fields) -> tuple[ToolSpec, ...]:
    values = fields.read_list("tools") or []
    specs: list[ToolSpec] = []
    for index, value in enumerate(values):
        param = f"tools[{index}]"
        if not isinstance(value, dict):
            raise bad_request(f"{param}: expected an object, got {describe(value)}", param=param)
        tool = Fields(value, f"{param}.")
        if tool.read_optional_str("type") != "function":
            tool.fail("type", 'must be "function"')
        function = tool.read_object("function")
        tool.refuse_unread()
        specs.append(_read_function(function))
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        fields.fail("tools", f"function names must be unique, repeated: {', '.join(duplicates)}")
    return tuple(specs)


def _read_function(function: Fields) -> ToolSpec:
    name = function.read_optional_str("name")
    if name is None or not _FUNCTION_NAME.fullmatch(name):
        function.fail("name", "is required: 1 to 64 letters, digits, underscores or dashes")
    description = function.read_optional_str("description")
    function.read_bool("strict", False)  # the grammar enforces the schema either way
    parameters = function.raw("parameters")
    if parameters is None:
        parameters = _NO_PARAMETERS
    elif not isinstance(parameters, dict):
        function.fail("parameters", f"expected a JSON schema object, got {describe(parameters)}")
    function.refuse_unread()
    entry: dict[str, Any] = {"name": name, "parameters": parameters}
    if description is not None:
        entry["description"] = description
    return ToolSpec(
        name=name, parameters=parameters, template_entry={"type": "function", "function": entry}
    )
