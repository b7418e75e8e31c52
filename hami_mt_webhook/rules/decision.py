"""The outcome of admitting one pod: allowed or denied, warnings, and a minimal JSON Patch.

The patch is written while the rules decide, one change per changed field, and the patched
object is built alongside it by copying only the dicts and lists on the changed paths. Changes keep
tuple paths; they become JSON Patch (RFC 6901 pointers) only when an answer is written out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

__all__ = ["Decision", "Patch", "pointer"]

Path = tuple[str | int, ...]


class Change(NamedTuple):
    """One JSON Patch operation, its path still a tuple of keys and indexes."""

    op: str  # "add" or "replace"
    path: Path
    value: Any


def json_patch(changes: Sequence[Change]) -> list[dict[str, Any]]:
    """The changes as JSON Patch operations, paths written as pointers."""
    return [{"op": c.op, "path": pointer(c.path), "value": c.value} for c in changes]


@lru_cache(maxsize=1024)
def pointer(path: Path) -> str:
    """RFC 6901 pointer: `~` becomes `~0` and `/` becomes `~1` (so `mthreads.com~1vgpu`)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


class Patch:
    """Changes plus the copy-on-write object they produce."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.result = original
        self.changes: list[Change] = []
        self._own: set[int] = set()  # ids of containers copied by this patch, safe to write into

    def set(self, path: Path, value: Any) -> None:
        """Make `path` hold `value`, creating missing parents with one `add` of the nested value."""
        node = self.result
        for depth, key in enumerate(path[:-1]):
            child = _child(node, key)
            if not isinstance(child, (dict, list)):
                nested = value
                for k in reversed(path[depth + 1:]):
                    nested = {k: nested}
                self._write(path[:depth + 1], nested, _has(node, key))
                return
            node = child
        present = _has(node, path[-1])
        if present and _child(node, path[-1]) == value:
            return
        self._write(path, value, present)

    def update(self, path: Path, values: Mapping[str, Any]) -> None:
        """Set each key of `values` under `path`; one `add` of the whole map when `path` is missing."""
        node = self.result
        for key in path:
            node = _child(node, key)
        if not isinstance(node, dict):
            self.set(path, dict(values))
            return
        for key, value in values.items():
            self.set((*path, key), value)

    def _write(self, path: Path, value: Any, present: bool) -> None:
        self.changes.append(Change("replace" if present else "add", path, value))
        self.result = self._owned(self.result)
        node = self.result
        for key in path[:-1]:
            child = self._owned(node[key])
            node[key] = child
            node = child
        node[path[-1]] = value

    def _owned(self, node: Any) -> Any:
        if id(node) in self._own:
            return node
        copy = dict(node) if isinstance(node, dict) else list(node)
        self._own.add(id(copy))
        return copy


def _child(node: Any, key: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return None


def _has(node: Any, key: str | int) -> bool:
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)


class Denied(Exception):
    """Raised inside the rules where a check fails; the rule's caller turns it into a denial."""

    def __init__(self, message: str, reason: str, code: int = 403) -> None:
        super().__init__(message)
        self.message, self.reason, self.code = message, reason, code

    def decision(self, obj: Any = None) -> Decision:
        return Decision.deny(self.message, self.reason, self.code, obj=obj)


@dataclass
class Decision:
    """What the webhook answers for one pod."""

    allowed: bool = True
    code: int = 200
    message: str = ""
    reason: str = ""  # a short machine-readable cause of a denial, for metrics and logs
    warnings: list[str] = field(default_factory=list)
    changes: Sequence[Change] = ()
    object: Any = None  # the pod after the changes
    mutations: list[str] = field(default_factory=list)  # kinds of change: exclusive, snap, vendor-form, ...
    #: The reasons of the denials turned into warnings (SPEC.md §4.10).
    would_deny: list[str] = field(default_factory=list)

    @property
    def patch(self) -> list[dict[str, Any]]:
        """The changes as JSON Patch, as the AdmissionReview response and `review -o json` carry them."""
        return json_patch(self.changes)

    @classmethod
    def deny(cls, message: str, reason: str, code: int = 403, obj: Any = None,
             warnings: Sequence[str] = ()) -> Decision:
        return cls(allowed=False, code=code, message=message, reason=reason, object=obj,
                   warnings=list(warnings))
