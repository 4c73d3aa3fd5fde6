"""Request fields OpenAI's clients send that change nothing this server computes: accepted, and
each logged once, instead of failing the request (vLLM learned to accept them too).

A field that would change the output and is not built stays a 400 naming it
(``Fields.refuse_unread``).
"""

from __future__ import annotations

import logging
import threading

from metrale_server.api.fields import Fields

logger = logging.getLogger(__name__)

# name -> the JSON type it must have (a wrong type is still a 400).
INERT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "user": str,  # an end-user id, for the caller's abuse monitoring
    "store": bool,  # OpenAI keeps the completion for its dashboard
    "metadata": dict,  # tags for stored completions
    "service_tier": str,  # OpenAI's processing tier
    "prompt_cache_key": str,  # OpenAI's cache routing hint; prefix caching needs none
    "safety_identifier": str,
}

_logged: set[str] = set()
_lock = threading.Lock()


def accept_inert_fields(fields: Fields) -> None:
    """Read the inert fields that are set (a wrong type is a 400); log each name once."""
    for name, expected in INERT_FIELDS.items():
        value = fields.raw(name)
        if value is None:
            continue
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            fields.fail(name, f"expected {_describe(expected)}")
        with _lock:
            is_new = name not in _logged
            _logged.add(name)
        if is_new:
            logger.info("request field %r is accepted and changes nothing here", name)


def _describe(expected: type | tuple[type, ...]) -> str:
    names = {str: "a string", bool: "a boolean", dict: "an object"}
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(names.get(kind, kind.__name__) for kind in kinds)
