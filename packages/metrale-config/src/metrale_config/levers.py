"""The ``METRALE_*`` environment levers: one declared table, typed reads, the rest refused."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from metrale_config.errors import ConfigError, UndeclaredLeverError

LeverValue = bool | int | float | str
LEVER_PREFIX = "METRALE_"

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


@attrs.frozen(kw_only=True)
class Lever:
    """One environment variable: its type, its value when unset (or empty), and what it does."""

    name: str
    type: type[LeverValue]
    default: LeverValue | None
    doc: str


def _declare(*levers: Lever) -> Mapping[str, Lever]:
    return MappingProxyType({lever.name: lever for lever in levers})


LEVERS: Mapping[str, Lever] = _declare(
    Lever(
        name="METRALE_DEFAULT_MODEL",
        type=str,
        default=None,
        doc="Model path used instead of the bundled default model.",
    ),
    Lever(
        name="METRALE_NO_PROGRESS",
        type=bool,
        default=False,
        doc="Hide the weight-loading progress bar.",
    ),
    Lever(name="METRALE_NO_TUI", type=bool, default=False, doc="Do not start the terminal UI."),
    Lever(
        name="METRALE_HOME",
        type=str,
        default="~/.metrale",
        doc="Directory for Metrale's state (not expanded: callers expand '~').",
    ),
    Lever(
        name="METRALE_MAX_BODY_BYTES",
        type=int,
        default=8 * 1024 * 1024,
        doc="Largest HTTP request body accepted, in bytes (met serve --max-body-bytes).",
    ),
    Lever(
        name="METRALE_API_KEY",
        type=str,
        default=None,
        doc="API keys for met serve, whitespace-separated, as --api-key takes them (and out of "
        "sight of ps).",
    ),
    Lever(
        name="METRALE_GLM_DSA_INDEXER_FLAT",
        type=bool,
        default=False,
        doc="Keep the GLM DSA indexer cache flat per sequence instead of paged.",
    ),
    Lever(
        name="METRALE_NATIVE_MARCH",
        type=str,
        default="native",
        doc="The -march the cpu kernel backend's native ops are compiled for (default: this "
        "CPU); e.g. haswell builds the AVX2 paths on an AVX-512 machine, to test them.",
    ),
    Lever(
        name="METRALE_ENFORCE_EAGER",
        type=bool,
        default=False,
        doc="Never compile the model's layer steps (the default of --enforce-eager); the test "
        "suites set it so that each engine they build does not compile.",
    ),
    Lever(
        name="METRALE_BENCH_DIR",
        type=str,
        default=None,
        doc="Directory where `met bench` writes and lists its records (unset: "
        "$XDG_DATA_HOME/metrale/bench, else ~/.local/share/metrale/bench).",
    ),
)


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _parse(lever: Lever, raw: str) -> LeverValue:
    text = raw.strip()
    if lever.type is bool:
        word = text.lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        expected = "a boolean (1/0, true/false, yes/no, on/off)"
    elif lever.type is int:
        try:
            return int(text)
        except ValueError:
            expected = "an integer"
    elif lever.type is float:
        try:
            return float(text)
        except ValueError:
            expected = "a number"
    else:
        return raw
    raise ConfigError(f"environment variable {lever.name} must be {expected}, got {raw!r}")


def read_lever(name: str, environ: Mapping[str, str] | None = None) -> LeverValue | None:
    """The typed value of lever ``name``, or its default when unset or empty.

    Raises ``UndeclaredLeverError`` for a name not in ``LEVERS`` and ``ConfigError`` naming the
    variable and the expected type for a value that does not parse.
    """
    lever = LEVERS.get(name)
    if lever is None:
        raise UndeclaredLeverError(f"{name} is not a declared lever{_suggestion(name)}")
    raw = _environ(environ).get(name, "")
    if raw == "":
        return lever.default
    return _parse(lever, raw)


def read_bool_lever(name: str, environ: Mapping[str, str] | None = None) -> bool:
    value = read_lever(name, environ)
    if not isinstance(value, bool):
        raise TypeError(f"lever {name} is not a boolean lever")
    return value


def read_int_lever(name: str, environ: Mapping[str, str] | None = None) -> int:
    value = read_lever(name, environ)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"lever {name} is not an integer lever")
    return value


def read_str_lever(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    value = read_lever(name, environ)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"lever {name} is not a string lever")
    return value


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse the environment at start: every undeclared ``METRALE_*`` variable, then bad values.

    Raises ``UndeclaredLeverError`` listing each undeclared variable (with a "did you mean"
    when a declared name is close), or ``ConfigError`` for a declared one that does not parse.
    """
    env = _environ(environ)
    undeclared = sorted(
        name for name in env if name.startswith(LEVER_PREFIX) and name not in LEVERS
    )
    if undeclared:
        listed = "; ".join(f"{name}{_suggestion(name)}" for name in undeclared)
        raise UndeclaredLeverError(f"undeclared METRALE_* environment variables: {listed}")
    for name in LEVERS:
        read_lever(name, env)


def _suggestion(name: str) -> str:
    matches = difflib.get_close_matches(name, list(LEVERS), n=1)
    return f" (did you mean {matches[0]}?)" if matches else ""
