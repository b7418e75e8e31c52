"""Helpers over objects as the API server returns them (plain dicts), and how a finding names its object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Obj", "Subject", "mapping", "metadata", "name_of", "namespace_of", "ref", "sequence"]

Obj = dict[str, Any]


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sequence(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("namespace") or "")


def ref(obj: Mapping[str, Any]) -> str:
    return f"{namespace_of(obj)}/{name_of(obj)}" if namespace_of(obj) else name_of(obj)



def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked as the object's controller, if any."""
    return next((mapping(o) for o in sequence(metadata(obj).get("ownerReferences"))
                 if mapping(o).get("controller")), None)


@dataclass(frozen=True)
class Subject:
    """The object a result is about, as a PolicyReport's `resources` entry names it."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, obj: Mapping[str, Any], kind: str = "", api_version: str = "") -> Subject:
        meta = metadata(obj)
        return cls(str(obj.get("apiVersion") or api_version), str(obj.get("kind") or kind),
                   str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""))

    def label(self) -> str:
        """`Pod team-a/train-0`, as doctor prints an object."""
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    def reference(self) -> dict[str, str]:
        """The ObjectReference a report's result carries."""
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out
