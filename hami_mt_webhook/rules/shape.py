"""The parts of a pod every step reads: its containers, and each container's resources and privilege.

Pods arrive as decoded JSON, so their objects are dicts; whatever has another shape is passed over
here (`slots` is where a malformed pod is denied). Ephemeral containers are not walked: they take no
resources, and only `pods.ephemeral` judges them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .config import Config

__all__ = ["GROUPS", "asks_for_slices", "containers", "named", "privileged", "resources"]

#: The pod spec's lists of containers that take resources, in the order they start.
GROUPS = ("initContainers", "containers")
#: The two maps of a container's resources.
PARTS = ("limits", "requests")


def containers(spec: Any) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(group, index, container) for each container object of the pod spec, init containers first."""
    if not isinstance(spec, dict):
        return
    for group in GROUPS:
        items = spec.get(group)
        if isinstance(items, list):
            for index, container in enumerate(items):
                if isinstance(container, dict):
                    yield group, index, container


def resources(container: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A container's limits and requests; a map that is absent or not an object reads as empty."""
    found = container.get("resources") if isinstance(container, dict) else None
    limits = found.get("limits") if isinstance(found, dict) else None
    requests = found.get("requests") if isinstance(found, dict) else None
    return (limits if isinstance(limits, dict) else {}), (requests if isinstance(requests, dict) else {})


def named(names: Iterable[str], limits: Mapping[str, Any], requests: Mapping[str, Any]) -> tuple[str, ...]:
    """The resources of `names`, in their order, that the limits or the requests list."""
    return tuple(name for name in names if name in limits or name in requests)


def privileged(container: Any) -> bool:
    """A privileged container sees every card of its node (SPEC.md §4.3)."""
    security = container.get("securityContext") if isinstance(container, dict) else None
    return isinstance(security, dict) and security.get("privileged") is True


def sidecar(container: Any) -> bool:
    """An init container with restartPolicy Always runs beside the app containers."""
    return isinstance(container, dict) and container.get("restartPolicy") == "Always"


def asks_for_slices(pod: Any, config: Config) -> bool:
    """A container or init container (a sidecar too) names a slice resource in its limits or requests:
    the pods HAMi accounts for (SPEC.md §1), the same test as `Slot.asks` over a pod not yet read."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    return any(named(config.slices, *resources(c)) for _, _, c in containers(spec))
