"""The request fields that constrain the output → ``StructuredOutputsParams``.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``), vLLM's
``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``)
and its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
names. At most one of them may constrain a request; the grammar itself is compiled later
(``compile_structured``), where a schema the engine cannot use is a 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from metrale_server.api.errors import bad_request
from metrale_server.api.fields import Fields, describe
from metrale_server.api.prepare import RequestPreparer
from metrale_server.structured import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarError,
    StructuredOutputsParams,
)

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# OpenAI's structured outputs allow schemas of ~120,000 characters of names and values.
MAX_GRAMMAR_CHARS = 120_000
GRAMMAR_COMPILE_TIMEOUT_S = 10.0
STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object")


@attrs.frozen(kw_only=True)
class StructuredRequest:
    """What constrains the output, and the request field it came from (for errors)."""

    params: StructuredOutputsParams
    param: str


def read_structured_outputs(fields: Fields) -> StructuredRequest | None:
    """The one constraint the request sets, or ``None``; two at once is a 400."""
    found = [
        request
        for request in (
            _read_response_format(fields),
            _read_structured_outputs(fields),
            *(_read_guided(fields, name) for name in GUIDED_FIELDS),
        )
        if request is not None
    ]
    if len(found) > 1:
        fields.fail(
            found[1].param.split(".")[0],
            f"cannot be combined with {found[0].param.split('.')[0]}: set one constraint",
        )
    return found[0] if found else None


async def compile_structured(
    compiler: Callable[[], GrammarCompiler],
    request: StructuredRequest | None,
    preparer: RequestPreparer,
) -> CompiledGrammar | None:
    """Compile (and cache) the request's grammar on the preparation threads, the compiler
    included (``compiler()`` builds it on first use); hand it to ``start_generations``. A 400
    naming the field it came from for a grammar the engine cannot build, one longer than
    ``MAX_GRAMMAR_CHARS`` or one whose compilation takes over ``GRAMMAR_COMPILE_TIMEOUT_S``."""
    if request is None:
        return None
    size = grammar_source_chars(request.params)
    if size > MAX_GRAMMAR_CHARS:
        raise bad_request(
            f"{request.param}: the constraint is {size} characters long; at most "
            f"{MAX_GRAMMAR_CHARS}",
            param=request.param,
        )
    try:
        return await preparer.run(
            lambda: compiler().compile(request.params),
            timeout_s=GRAMMAR_COMPILE_TIMEOUT_S,
            what=f"compiling the {request.param} grammar",
            param=request.param,
        )
    except GrammarError as error:
        raise bad_request(f"{request.param}: {error}", param=request.param) from error


def grammar_source_chars(params: StructuredOutputsParams) -> int:
    """The length of the constraint's text (a schema's JSON, a regex, a grammar, choices)."""
    texts = (params.json, params.regex, params.grammar, *(params.choice or ()))
    return sum(len(text) for text in texts if text is not None)


def _read_response_format(fields: Fields) -> StructuredRequest | None:
    response_format = fields.read_object("response_format")
    kind = response_format.read_optional_str("type")
    if not response_format.body:
        return None
    if kind is None:
        response_format.fail("type", "is required")
    if kind == "text":
        response_format.refuse_unread()
        return None
    if kind == "json_object":
        response_format.refuse_unread()
        return StructuredRequest(
            params=StructuredOutputsParams(json_object=True), param="response_format"
        )
    if kind != "json_schema":
        response_format.fail("type", f"must be one of text, json_object, json_schema, got {kind!r}")
    json_schema = response_format.read_object("json_schema")
    response_format.refuse_unread()
    if not json_schema.body:
        response_format.fail("json_schema", "is required when type is json_schema")
    json_schema.read_optional_str("name")
    json_schema.read_optional_str("description")
    # Whether strict or not, the schema is enforced: nothing else would be honest.
    json_schema.read_bool("strict", False)
    schema = json_schema.raw("schema")
    json_schema.refuse_unread()
    param = "response_format.json_schema.schema"
    if schema is None:
        return StructuredRequest(params=StructuredOutputsParams(json_object=True), param=param)
    return StructuredRequest(params=_schema_params(json_schema, "schema", schema), param=param)


def _read_structured_outputs(fields: Fields) -> StructuredRequest | None:
    options = fields.read_object("structured_outputs")
    if not options.body:
        return None
    set_keys = [key for key in STRUCTURED_OUTPUTS_KEYS if options.raw(key) not in (None, False)]
    options.refuse_unread()
    if len(set_keys) != 1:
        fields.fail(
            "structured_outputs",
            f"set exactly one of {', '.join(STRUCTURED_OUTPUTS_KEYS)}"
            + (f", got {', '.join(set_keys)}" if set_keys else ""),
        )
    [key] = set_keys
    param = options.param(key)
    if key == "json_object":
        options.read_bool(key, False)
        return StructuredRequest(params=StructuredOutputsParams(json_object=True), param=param)
    return StructuredRequest(params=_params_for(options, key, key), param=param)


def _read_guided(fields: Fields, name: str) -> StructuredRequest | None:
    if not fields.has(name):
        return None
    return StructuredRequest(
        params=_params_for(fields, name, name.removeprefix("guided_")), param=name
    )


def _params_for(fields: Fields, name: str, kind: str) -> StructuredOutputsParams:
    value = fields.raw(name)
    if kind == "json":
        return _schema_params(fields, name, value)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            fields.fail(name, f"expected a non-empty array of strings, got {describe(value)}")
        if not all(value):
            fields.fail(name, "choices must not be empty strings")
        return StructuredOutputsParams(choice=tuple(value))
    if not isinstance(value, str) or not value:
        fields.fail(name, f"expected a non-empty string, got {describe(value)}")
    if kind == "regex":
        return StructuredOutputsParams(regex=value)
    return StructuredOutputsParams(grammar=value)


def _schema_params(fields: Fields, name: str, value: Any) -> StructuredOutputsParams:
    """A JSON schema given as an object, or as the JSON text of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise bad_request(
                f"{fields.param(name)}: is not valid JSON: {error}", param=fields.param(name)
            ) from error
    if not isinstance(value, dict):
        fields.fail(name, f"expected a JSON schema object, got {describe(value)}")
    return StructuredOutputsParams(json=value)
