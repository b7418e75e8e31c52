"""A pod as the rules read it: its containers (slots), and the checks on the pod as a whole
(SPEC.md §3.1, §4).

Shapes the rules cannot read are denied here with HTTP code 400, so later steps can rely on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import Config
from .decision import Denied
from .owned import created
from .shape import GROUPS, PARTS, named, privileged, sidecar
from .text import clip, quote

__all__ = ["rewritten"]

DEFAULT_SCHEDULER = "default-scheduler"
#: A pod labelled so skips the mutating webhook (its objectSelector); the validating rules still apply
#: (§4.8).
IGNORE_LABEL = ("hami.io/webhook", "ignore")
#: How messages call a container of each list of the pod spec.
_KINDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


@dataclass(frozen=True)
class Slot:
    """One container (app, init or sidecar) and what it asks for."""

    group: str  # "containers" or "initContainers"
    index: int
    label: str  # 'container "main"' / 'init container "setup"'
    sidecar: bool
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    maps: frozenset[str]  # which of "limits" and "requests" the container writes as objects
    asks: bool  # asks for any slice resource
    whole: tuple[str, ...]  # the whole-card resources it asks for

    @property
    def path(self) -> tuple[str | int, ...]:
        return ("spec", self.group, self.index)

    @property
    def shares_card_time(self) -> bool:
        """App containers and sidecars run together; plain init containers run before them."""
        return self.group == "containers" or self.sidecar


def ignores_mutation(pod: Any) -> bool:
    """§4.8: the pod's own `hami.io/webhook: ignore` label skips the mutating webhook, and nothing else."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    key, value = IGNORE_LABEL
    return isinstance(labels, dict) and labels.get(key) == value


def rewritten(scheduler: object, config: Config) -> bool:
    """§4.2: the scheduler names a slice pod is moved off: none, the default scheduler, or a retired one.
    Any value: the pod's schedulerName is not yet known to be a string."""
    return scheduler in ("", DEFAULT_SCHEDULER) or scheduler in config.retired_schedulers


def label(group: str, index: int, container: Any) -> str:
    """How messages name a container: its kind and name, or its index when it has no name."""
    name = container.get("name") if isinstance(container, dict) else None
    kind = _KINDS.get(group, "container")
    return f'{kind} "{clip(name)}"' if isinstance(name, str) and name else f"{kind} #{index}"


def slots(pod: Any, config: Config) -> list[Slot]:
    """Read the pod's containers, denying shapes the rules cannot read (HTTP code 400)."""
    if not isinstance(pod, dict):
        raise Denied("the object is not a Pod (expected a JSON object)", "malformed", 400)
    if pod.get("metadata") is not None and not isinstance(pod.get("metadata"), dict):
        raise Denied("metadata must be an object", "malformed", 400)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise Denied("the Pod has no spec", "malformed", 400)
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise Denied("the Pod has no containers: spec.containers must list at least one", "malformed", 400)
    out = []
    for group in GROUPS:
        items = spec.get(group) or []
        if not isinstance(items, list):
            raise Denied(f"spec.{group} must be a list", "malformed", 400)
        out += [_slot(group, index, container, config) for index, container in enumerate(items)]
    return out


def _slot(group: str, index: int, container: Any, config: Config) -> Slot:
    name = label(group, index, container)
    if not isinstance(container, dict):
        raise Denied(f"spec.{group}[{index}] must be an object", "malformed", 400)
    resources = container.get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise Denied(f"{name}: resources must be an object", "malformed", 400)
    resources = resources or {}
    maps: dict[str, Mapping[str, Any]] = {}
    for part in PARTS:
        value = resources.get(part)
        if value is not None and not isinstance(value, dict):
            raise Denied(f"{name}: resources.{part} must be an object", "malformed", 400)
        if value is not None:
            maps[part] = value
    limits, requests = maps.get("limits", {}), maps.get("requests", {})
    return Slot(group, index, name, sidecar(container), limits, requests, frozenset(maps),
                asks=bool(named(config.slices, limits, requests)),
                whole=named(config.whole_card, limits, requests))


def mixing(slots: list[Slot], config: Config) -> None:
    """§3.1: a container takes whole cards or slices; checked on every pod, whatever its scheduler."""
    for slot in slots:
        if slot.asks and slot.whole:
            whole = ", ".join(slot.whole)
            sliced = ", ".join(named(config.slices, slot.limits, slot.requests))
            raise Denied(f"{slot.label} asks for {whole} (whole cards, outside HAMi) and for {sliced} "
                         "(sGPU slices) at once; a container takes whole cards or slices, not both: "
                         f"remove {whole} to share a card, or remove {sliced} to take whole cards", "mixing")


def pod_checks(pod: dict[str, Any], slots: list[Slot], config: Config) -> None:
    """§4.3 and §4.6: placement is hami-scheduler's, and so are its bind-time annotations."""
    spec = pod["spec"]
    if spec.get("nodeName"):
        raise Denied(f"the pod sets spec.nodeName {quote(spec['nodeName'])}, but a pod with sGPU slices "
                     f"must be placed by {config.scheduler_name}; remove nodeName and use a nodeSelector on "
                     "kubernetes.io/hostname instead", "node-name")
    for slot in slots:
        if privileged(spec[slot.group][slot.index]):
            raise Denied(f"{slot.label} is privileged, and a privileged container sees every card, so the "
                         "pod cannot take sGPU slices; remove securityContext.privileged", "privileged")
    created(pod, config)


def unmutated(pod: dict[str, Any], slots: list[Slot], scheduler: str, config: Config) -> None:
    """§4.8/§5: a pod with slices still on the default scheduler would run outside HAMi's accounting."""
    first = next(s for s in slots if s.asks)
    shown = scheduler or "unset"
    if ignores_mutation(pod):
        why = (f"its {IGNORE_LABEL[0]}: {IGNORE_LABEL[1]} label skips the mutation only; "
               f"set spec.schedulerName: {config.scheduler_name}, or remove the label")
    else:
        why = (f"hami-mt-webhook did not mutate it (it would have set {config.scheduler_name}); "
               f"set spec.schedulerName: {config.scheduler_name}")
    message = f"{first.label} asks for sGPU slices but spec.schedulerName is {shown}: {why}"
    raise Denied(message, "unmutated")
