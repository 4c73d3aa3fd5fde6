"""``ChatTemplate``: a model's Jinja chat template, found and rendered the way transformers does."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs
import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHAT_TEMPLATE_FILE = "chat_template.jinja"
ADDITIONAL_CHAT_TEMPLATES_DIR = "additional_chat_templates"
GGUF_CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
DEFAULT_TEMPLATE_NAME = "default"

# Names a message's reasoning arrives under; templates read the first, gpt-oss ones "thinking".
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

Message = Mapping[str, Any]


class ChatTemplateError(ValueError):
    """A chat template that cannot be found, compiled or rendered for the given messages."""


@attrs.frozen(kw_only=True, eq=False)
class ChatTemplate:
    """A compiled chat template plus the special-token variables it sees.

    ``origin`` names where the template came from, for error messages. ``special_tokens`` maps
    ``bos_token``/``eos_token``/... to their strings (``Tokenizer.special_tokens_map``).
    Construction compiles the template and raises ``ChatTemplateError`` on a syntax error.
    """

    source: str = attrs.field(repr=False)
    origin: str
    special_tokens: Mapping[str, str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        _compile(self.source, self.origin)

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        special_tokens: Mapping[str, str] | None = None,
        name: str = DEFAULT_TEMPLATE_NAME,
    ) -> ChatTemplate | None:
        """The template a Hugging Face model directory declares, or ``None`` if it has none.

        Looks at ``chat_template.jinja`` (and ``additional_chat_templates/<name>.jinja``) first,
        then ``tokenizer_config.json``'s ``chat_template``: a string, or a list of
        ``{"name", "template"}`` from which ``name`` is picked.
        """
        model_dir = Path(model_dir)
        tokens = dict(special_tokens or {})
        if name == DEFAULT_TEMPLATE_NAME:
            template_file = model_dir / CHAT_TEMPLATE_FILE
        else:
            template_file = model_dir / ADDITIONAL_CHAT_TEMPLATES_DIR / f"{name}.jinja"
        if template_file.is_file():
            source = template_file.read_text(encoding="utf-8")
            return cls(source=source, origin=str(template_file), special_tokens=tokens)

        config_file = model_dir / "tokenizer_config.json"
        if not config_file.is_file():
            return None
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ChatTemplateError(f"{config_file}: cannot be read: {error}") from error
        declared = config.get("chat_template") if isinstance(config, dict) else None
        if declared is None:
            return None
        origin = f"{config_file} chat_template"
        if isinstance(declared, str):
            return cls(source=declared, origin=origin, special_tokens=tokens)
        named = _named_templates(declared, origin)
        if name not in named:
            raise ChatTemplateError(
                f"{origin}: no template named {name!r} (available: {', '.join(sorted(named))})"
            )
        return cls(source=named[name], origin=f"{origin} {name!r}", special_tokens=tokens)

    @classmethod
    def from_gguf_fields(
        cls, fields: Mapping[str, Any], *, special_tokens: Mapping[str, str] | None = None
    ) -> ChatTemplate | None:
        """The template in GGUF metadata ``tokenizer.chat_template``, or ``None``."""
        source = fields.get(GGUF_CHAT_TEMPLATE_KEY)
        if source is None:
            return None
        return cls(
            source=str(source),
            origin=f"GGUF {GGUF_CHAT_TEMPLATE_KEY}",
            special_tokens=dict(special_tokens or {}),
        )

    @property
    def is_content_parts_aware(self) -> bool:
        """Whether the template loops over a message's ``content`` (reads a list of parts).

        When it does not, ``render`` joins text parts into one string first.
        """
        return _loops_over_content(self.source)

    def variable_error(self, name: str) -> str | None:
        """Why a caller's variable (``chat_template_kwargs``) may not be named ``name``, or
        None: it must be an identifier, not private, and not one the template's own
        rendering sets (messages, tools, the special tokens, the environment's globals such as
        ``raise_exception``)."""
        if not name.isidentifier() or name.startswith("_") or name == "self":
            return "is not a template variable a request may set"
        if name in RENDER_VARIABLES or name in self.special_tokens:
            return "is set by the request or the tokenizer, not through chat_template_kwargs"
        if name in _environment().globals:
            return "names one of the template's own functions"
        return None

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text for ``messages``.

        Each message is a mapping with ``role`` and ``content`` (a string, or a list of
        ``{"type": "text", "text": ...}`` parts); keys whose value is ``None`` are dropped, as
        transformers does. ``variables`` override the special-token variables. A template error
        (including ``raise_exception``) raises ``ChatTemplateError``.
        """
        template = _compile(self.source, self.origin)
        keep_parts = self.is_content_parts_aware
        prepared = [_prepare_message(message, keep_parts) for message in messages]
        context = {**self.special_tokens, **variables}
        try:
            return template.render(
                messages=prepared,
                tools=None if tools is None else [dict(tool) for tool in tools],
                documents=None if documents is None else [dict(doc) for doc in documents],
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template ({self.origin}): {error}") from error


def _named_templates(declared: object, origin: str) -> dict[str, str]:
    if not isinstance(declared, list):
        raise ChatTemplateError(f"{origin}: expected a string or a list of {{name, template}}")
    named: dict[str, str] = {}
    for entry in declared:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("template"), str)
        ):
            raise ChatTemplateError(f"{origin}: entry {entry!r} is not {{name, template}}")
        named[entry["name"]] = entry["template"]
    return named


def _prepare_message(message: Message, keep_parts: bool) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"a chat message must be a mapping, got {type(message).__name__}")
    prepared = {key: value for key, value in message.items() if value is not None}
    content = prepared.get("content")
    if isinstance(content, list) and not keep_parts:
        prepared["content"] = _join_text_parts(content)
    reasoning = next((prepared[key] for key in _REASONING_FIELDS if key in prepared), None)
    if reasoning is not None:
        prepared = {"thinking": reasoning, **prepared, "reasoning_content": reasoning}
    return prepared


def _join_text_parts(parts: list[Any]) -> str:
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ChatTemplateError(f"message content part of type {kind!r} is not supported")
    return "\n".join(texts)


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (transformers uses the tag to
    mark assistant tokens)."""

    tags = {"generation"}  # noqa: RUF012 -- jinja2 reads this class attribute

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore-prefixed attributes (no reaching into internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, positional = args[0], args[1:]
        attributes = dict(*positional, **kwargs)
        for name in attributes:
            _check_attribute_name(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_attribute_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_attribute_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"a chat template cannot set the underscore-prefixed attribute {name!r}"
        )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


# What ``render`` passes itself; a caller's variables may not replace them.
RENDER_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["namespace"] = _Namespace
    return environment


@lru_cache(maxsize=32)
def _compile(source: str, origin: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"chat template ({origin}) does not compile: {error}") from error


@lru_cache(maxsize=32)
def _loops_over_content(source: str) -> bool:
    tree = _environment().parse(source)
    content_names = {
        target.name
        for assign in tree.find_all(jinja2.nodes.Assign)
        if _reads_content(assign.node)
        for target in _assigned_names(assign.target)
    }
    for loop in tree.find_all(jinja2.nodes.For):
        iterated = _unwrap_filters(loop.iter)
        if _reads_content(iterated) or (
            isinstance(iterated, jinja2.nodes.Name) and iterated.name in content_names
        ):
            return True
    return False


def _unwrap_filters(node: jinja2.nodes.Node) -> jinja2.nodes.Node:
    while isinstance(node, jinja2.nodes.Filter) and node.node is not None:
        node = node.node
    return node


def _reads_content(node: jinja2.nodes.Node) -> bool:
    node = _unwrap_filters(node)
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == "content"
    if isinstance(node, jinja2.nodes.Getitem):
        return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content"
    return False


def _assigned_names(target: jinja2.nodes.Node) -> Iterator[jinja2.nodes.Name]:
    if isinstance(target, jinja2.nodes.Name):
        yield target
    elif isinstance(target, jinja2.nodes.Tuple):
        for item in target.items:
            yield from _assigned_names(item)
