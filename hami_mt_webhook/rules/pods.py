"""HAMi's admission rules for Moore Threads slices, as pure functions (SPEC.md §3–§5).

`mutate` is the mutating webhook: it fills, snaps and copies slice quantities and sets the
scheduler. `validate` is the validating webhook: it re-checks the final pod after every mutating
webhook, by deciding the pod again and comparing that decision with what the pod says. Both take
plain dicts and return a Decision; neither does I/O. The steps live beside this module: the pod's
containers and checks (slots), one container's values (fill), and the one-card rule (onecard).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .capacity import ClusterView
from .config import Config
from .decision import Decision, Denied, Patch
from .fill import Fill, fill, same
from .onecard import one_card
from .owned import created
from .record import RECORD, record
from .shape import containers, privileged
from .slots import (
    DEFAULT_SCHEDULER,
    IGNORE_LABEL,
    Slot,
    ignores_mutation,
    label,
    mixing,
    pod_checks,
    rewritten,
    slots,
    unmutated,
)
from .text import quote

__all__ = ["defaulted", "ephemeral", "ignores_mutation", "mutate", "validate"]

@dataclass(frozen=True)
class Plan:
    """What the mutating rules decided for one pod, before it is written as a patch."""

    fills: Sequence[tuple[Slot, Fill]] = ()  # the containers that ask for slices, and their values
    scheduler: str | None = None  # the scheduler to set, when it changes
    toleration: dict[str, str] | None = None  # to add, when the pod does not already tolerate the taint
    cards: int = 1
    warnings: Sequence[str] = ()
    mutations: Sequence[str] = ()


def mutate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """The mutating webhook's answer for a pod being created."""
    try:
        found = slots(pod, config)
        mixing(found, config)
        plan = _plan(pod, found, view, config)
        if not plan.fills:
            created(pod, config)  # §4.6 holds for every pod; _plan checked HAMi's
    except Denied as denial:
        return denial.decision(pod)
    if not plan.fills:
        return Decision(object=pod, warnings=list(plan.warnings))
    patch = Patch(pod)
    spec = pod["spec"]
    if plan.scheduler is not None:
        patch.set(("spec", "schedulerName"), plan.scheduler)
    if plan.toleration is not None:
        present = spec.get("tolerations")
        tolerations = present if isinstance(present, list) else []
        patch.set(("spec", "tolerations"), [*tolerations, plan.toleration])
    for slot, chosen in plan.fills:
        _write(patch, slot, chosen)
    if plan.cards > 1:
        patch.set(("metadata", "annotations", config.gpu_num_annotation), str(plan.cards))
    mutations = list(plan.mutations)
    # Last, over the finished pod: the validating webhook is sent the pod only when its final object no
    # longer matches this record (a later mutator changed it), and a record the pod came with is overwritten.
    written = len(patch.changes)
    patch.set(("metadata", "annotations", RECORD), record(patch.result, config))
    if len(patch.changes) > written and not mutations:  # in admitted form already, but without its record
        mutations.append("record")
    return Decision(warnings=list(plan.warnings), changes=patch.changes, object=patch.result,
                    mutations=mutations)


def validate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """The validating webhook's answer for the final pod (SPEC.md §5); never mutates."""
    try:
        found = slots(pod, config)
        mixing(found, config)
        if not any(s.asks for s in found):
            created(pod, config)  # §4.6 holds for every pod (the guard's webhook sends any that carries one)
            return Decision(object=pod)
        scheduler = pod["spec"].get("schedulerName") or ""
        if scheduler in ("", DEFAULT_SCHEDULER):
            unmutated(pod, found, scheduler, config)
        if scheduler != config.scheduler_name:
            created(pod, config)
            return Decision(object=pod)
        plan = _plan(pod, found, view, config)
    except Denied as denial:
        return denial.decision(pod)
    differences = [d for slot, chosen in plan.fills for d in _differences(slot, chosen)]
    if differences:
        why = (f"The pod's {IGNORE_LABEL[0]}: {IGNORE_LABEL[1]} label skipped the mutation, so the values "
               "must be written in their admitted form" if ignores_mutation(pod) else
               "The pod was changed after hami-mt-webhook admitted it (another mutating webhook?)")
        return Decision.deny(
            f"{'; '.join(differences)}. {why}; slice quantities must be whole, valid tiers, with requests "
            "equal to limits", "changed-after-mutation", obj=pod)
    return Decision(object=pod)


def ephemeral(pod: Any, old: Any, config: Config) -> Decision:
    """§4.3 on UPDATE of pods/ephemeralcontainers: a new privileged ephemeral container sees every card.

    Only the ephemeral containers absent from the old object are judged, and only by the privilege
    rule: a running pod's nodeName and bind-time annotations are expected here.
    """
    try:
        if not any(s.asks for s in slots(pod, config)):
            return Decision(object=pod)
        items = pod["spec"].get("ephemeralContainers") or []
        if not isinstance(items, list):
            raise Denied("spec.ephemeralContainers must be a list", "malformed", 400)
        old_spec = old.get("spec") if isinstance(old, dict) else None
        before = (old_spec.get("ephemeralContainers") if isinstance(old_spec, dict) else None) or []
        known = {c.get("name") for c in before if isinstance(c, dict)} if isinstance(before, list) else set()
        for index, container in enumerate(items):
            if not isinstance(container, dict) or container.get("name") in known:
                continue
            if privileged(container):
                raise Denied(f"{label('ephemeralContainers', index, container)} is privileged, and a "
                             "privileged container sees every card, so it cannot join a pod with sGPU "
                             "slices; remove securityContext.privileged (kubectl debug: --profile=general "
                             "instead of sysadmin)", "privileged")
    except Denied as denial:
        return denial.decision(pod)
    return Decision(object=pod)


def defaulted(pod: Any) -> Any:
    """The pod as the API server defaults it before admission: the default scheduler when none is named,
    and a resource in limits but not in requests requested at its limit. Files given to `review` are
    before it."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return pod
    patch = Patch(pod)
    if not spec.get("schedulerName"):
        patch.set(("spec", "schedulerName"), DEFAULT_SCHEDULER)
    for group, index, container in containers(spec):
        resources = container.get("resources")
        limits = resources.get("limits") if isinstance(resources, dict) else None
        requests = resources.get("requests") if isinstance(resources, dict) else None
        if isinstance(limits, dict) and (requests is None or isinstance(requests, dict)):
            missing = {k: v for k, v in limits.items() if k not in (requests or {})}
            if missing:
                patch.update(("spec", group, index, "resources", "requests"), missing)
    return patch.result


def _plan(pod: Any, found: list[Slot], view: ClusterView, config: Config) -> Plan:
    """Decide the pod: each slice container's values, the scheduler, the toleration and the card count."""
    if not any(s.asks for s in found):
        return Plan()  # §4.5: not a HAMi pod, untouched
    spec = pod["spec"]
    scheduler = spec.get("schedulerName") or ""
    retired = scheduler in config.retired_schedulers
    if scheduler != config.scheduler_name and not rewritten(scheduler, config):
        return Plan(warnings=[f"pod names scheduler {quote(scheduler)}: hami-mt-webhook leaves it "
                              "unchanged, and HAMi accounts for sGPU slices only on "
                              f"{config.scheduler_name}"])
    if not view.ready:
        raise Denied("hami-mt-webhook is starting and has not yet read the nodes' sGPU capacities; "
                     "retry in a few seconds", "not-ready", 503)
    pod_checks(pod, found, config)
    candidates = view.candidates(spec, config)
    fills = [(slot, fill(slot, candidates, config)) for slot in found if slot.asks]
    cards = one_card(fills, candidates, config)

    warnings = [w for _, f in fills for w in f.warnings]
    mutations = [m for _, f in fills for m in f.mutations]
    if scheduler != config.scheduler_name:
        mutations.append("retired-scheduler" if retired else "scheduler")
    toleration = None
    taint = config.sliced_node_taint
    if taint is not None and not _tolerated(spec.get("tolerations"), taint):
        # Opt-in: sliced nodes are tainted to keep whole-card pods off their cards; slice pods may go there.
        key, value, effect = taint
        toleration = {"key": key, "operator": "Equal", "value": value, "effect": effect} if value else \
            {"key": key, "operator": "Exists", "effect": effect}
        mutations.append("toleration")
    if retired:  # §4.2: unlike the plain rewrite, this one is worth a warning: the manifest is out of date
        warnings.insert(0, f"pod names scheduler {quote(scheduler)}, which is retired "
                           f"(--retired-schedulers): set {config.scheduler_name}; write schedulerName: "
                           f"{config.scheduler_name} in the manifest, or leave it out")
    rewrite = None if scheduler == config.scheduler_name else config.scheduler_name
    return Plan(fills, rewrite, toleration, cards, warnings, mutations)


def _tolerated(tolerations: Any, taint: tuple[str, str, str]) -> bool:
    """Whether the pod already tolerates the taint, by Kubernetes' matching rules (so none is added twice)."""
    key, value, effect = taint
    for t in tolerations if isinstance(tolerations, list) else []:
        if not isinstance(t, dict) or t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator") == "Exists":
            if t.get("key") in (None, "", key):
                return True
        elif t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def _changed(slot: Slot, chosen: Fill) -> list[tuple[str, dict[str, str]]]:
    """§3.7: every slice value goes to both limits and requests; what each of the two lacks."""
    out = []
    for part, current in (("limits", slot.limits), ("requests", slot.requests)):
        changed = {r: str(v) for r, v in chosen.values.items() if not same(current.get(r), v)}
        if changed:
            out.append((part, changed))
    return out


def _write(patch: Patch, slot: Slot, chosen: Fill) -> None:
    for part, changed in _changed(slot, chosen):
        patch.update((*slot.path, "resources", part), changed)


def _differences(slot: Slot, chosen: Fill) -> list[str]:
    """How the container differs from its admitted form: one line per value, or per missing map."""
    out = []
    for part, changed in _changed(slot, chosen):
        if part in slot.maps:
            out += [f"{slot.label}: {part}/{r} would be set to {v}" for r, v in changed.items()]
        else:
            out.append(f"{slot.label}: {part} would be set to {changed}")
    return out
