"""SPEC.md §4.6: the annotations hami-scheduler and the device plugins own.

A pod must not be created carrying one (whatever it asks for, whatever its scheduler), and on UPDATE
only their owners may add, change or remove one. The ValidatingAdmissionPolicy `hami-mt-annotation-guard`
says the same in CEL, with the same messages (tests compare the two).
"""

from __future__ import annotations

from typing import Any

from .config import Config
from .decision import Decision, Denied

__all__ = ["updated"]


def _annotations(pod: Any) -> dict[str, Any]:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    found = meta.get("annotations") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def _owners(config: Config) -> str:
    return f"{config.scheduler_name} and the device plugins"


def changed(old: Any, new: Any, config: Config) -> list[str]:
    """The owned annotations that differ between `old` and `new` (added, changed or removed)."""
    before, after = _annotations(old), _annotations(new)
    return [a for a in config.bind_annotations
            if (a in before) != (a in after) or before.get(a) != after.get(a)]


def created(pod: Any, config: Config) -> None:
    """Deny a new pod that carries an owned annotation (raises Denied)."""
    found = changed(None, pod, config)
    if found:
        raise Denied(f"annotation {found[0]} is written by {_owners(config)} when the pod is bound and must "
                     "not be set on a new pod; remove it", "bind-annotation")


def updated(old: Any, new: Any, user: Any, config: Config) -> Decision:
    """UPDATE of a pod (or its status): only the owners may add, change or remove an owned annotation."""
    found = changed(old, new, config)
    if not found or user in config.annotation_owners:
        return Decision(object=new)
    who = f"only {', '.join(config.annotation_owners)}" if config.annotation_owners else "no one"
    return Decision.deny(f"annotation {found[0]} is written by {_owners(config)} when the pod is bound; "
                         f"{who} may add, change or remove it", "owned-annotation", obj=new)
