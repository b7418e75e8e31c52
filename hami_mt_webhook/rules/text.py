"""Values from a request, as messages and log lines name them: never more than a short prefix.

A denial is sent back to the client and written to the log, so a value echoed whole would let a
client make both as large as its request (SPEC.md §6: at most the first 64 characters).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["clip", "quote"]

#: Characters of a value a message or log line quotes.
QUOTE_LIMIT = 64


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """A value in Python's quoting ('volcano'), cut to its first `limit` characters."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value)} characters)"
    return clip(repr(value), limit + 2)


def show(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """A value as JSON ("32", 7, null), cut to its first `limit` characters; other shapes by type name."""
    if isinstance(value, str) and len(value) > limit:
        return f"{json.dumps(value[:limit])}… ({len(value)} characters)"
    if isinstance(value, str | bool | int | float) or value is None:
        return clip(json.dumps(value), limit + 2)
    return type(value).__name__
