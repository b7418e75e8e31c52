"""What the mutating webhook decided, as one string the validating webhook's matchCondition rebuilds in CEL.

The validating webhook (SPEC.md §5) exists for pods that another mutator changed after ours. The mutating
webhook writes `record(pod)` of its own output into the annotation RECORD; the validating configuration's
matchCondition builds the same string from the final object and sends the pod only when the two differ,
the annotation is missing, the pod is not on the HAMi scheduler, or it carries the `hami.io/webhook: ignore`
label (the mutating webhook never ran on it, so the annotation may be the author's). The CEL text lives in
manifests/webhooks.yaml (and the chart); tests evaluate it against this function so the two cannot drift.

The string holds exactly what the validating rules read, each as a fixed token or an API-server-canonical
quantity, so it needs no escaping and is injective: nodeName set or not; which bind-time annotations are
present; then per init container and per app container, in order: sidecar (restartPolicy Always),
privileged, asks for a whole card, and the limit and request of each slice resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import Config
from .shape import GROUPS, named, privileged, resources, sidecar

#: The annotation the mutating webhook writes; users must not rely on it (docs/operating.md).
RECORD = "hami-mt.mthreads.com/admitted"
#: The record's format; the CEL builds the same prefix, so a record of another format never matches.
VERSION = "v1"
#: Stands for a slice resource that is absent from limits or requests; no quantity is written so.
ABSENT = "-"


def record(pod: Mapping[str, Any], config: Config) -> str:
    """The canonical string of the fields the validating rules read (see the module docstring).

    The pod is decoded JSON, so its objects are dicts: `isinstance(x, dict)` is a type check, where a
    Mapping check goes through the ABC machinery, a dozen times per review."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    spec = spec if isinstance(spec, dict) else {}
    node = "N" if spec.get("nodeName") else ""
    bound = "".join("1" if a in annotations else "0" for a in config.bind_annotations)
    groups = ["+".join(_container(c, config) for c in _items(spec.get(group))) for group in GROUPS]
    return "|".join((VERSION, node, bound, *groups))


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _container(container: Any, config: Config) -> str:
    limits, requests = resources(container)
    flags = (("S" if sidecar(container) else "") + ("P" if privileged(container) else "")
             + ("W" if named(config.whole_card, limits, requests) else ""))
    values = ",".join(f"{_value(limits, r)}/{_value(requests, r)}" for r in config.slices)
    return f"{flags}:{values}"


def _value(source: Mapping[str, Any], resource: str) -> str:
    return str(source[resource]) if resource in source else ABSENT
