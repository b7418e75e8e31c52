"""Rollout mode (SPEC.md §4.10): under `warn`, a rule's denial becomes the warning `would deny: <message>`.

The rules always decide as under `deny`; this layer rewrites their decisions. For the mutating webhook a
warning alone is not enough: the pod must still be mutated as far as the rules can, so that turning
`deny` on later changes nothing but the answer for the pods that were warned about. `mutate` gets there
by asking the rules again about a copy of the pod in which each denied part is set aside (a container's
slice resources, the pod's nodeName, a privileged flag, a bind-time annotation), and then writes the
patch the rules give for the copy onto the real pod. A container set aside is left as it was written.

Malformed reviews (code 400) and a webhook not yet ready (503) are answered the same in both modes: only
rule denials (403) are softened.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from ..rules import pods as rules
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision, Patch

WARN = "warn"
#: The prefix of every warning that stands for a denial under `warn`.
WOULD_DENY = "would deny: "


def softened(decision: Decision) -> bool:
    """Whether `decision` is a rule denial, the kind `warn` turns into a warning."""
    return not decision.allowed and decision.code == 403


def soften(decision: Decision, config: Config) -> Decision:
    """Under `warn`, a rule denial as an allowed answer with no patch and the warning `would deny: <message>`."""
    if config.enforcement != WARN or not softened(decision):
        return decision
    return Decision(object=decision.object, warnings=[*decision.warnings, WOULD_DENY + decision.message],
                    would_deny=[decision.reason or "other"])


def mutate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """The mutating webhook under the configured enforcement; under `warn`, as much of the mutation as the
    rules allow, with one `would deny` warning per part set aside."""
    decision = rules.mutate(pod, view, config)
    if config.enforcement != WARN or not softened(decision):
        return decision
    masked: Any = pod
    denials: list[Decision] = []
    while softened(decision) and len(denials) <= _parts(pod) + 3:  # each round sets one part aside
        denials.append(decision)
        masked = _set_aside(masked, decision, view, config)
        if masked is None:
            break
        decision = rules.mutate(masked, view, config)
    if masked is None or not decision.allowed:  # nothing more can be mutated: warn, and rewrite the scheduler
        decision = Decision(object=pod)
    patch = Patch(pod)
    for op in decision.patch:
        patch.set(_path(pod, op["path"]), op["value"])
    mutations = list(decision.mutations)
    if not {"scheduler", "retired-scheduler"} & set(mutations) and _rewrites_scheduler(pod, config):
        patch.set(("spec", "schedulerName"), config.scheduler_name)
        mutations.append("scheduler")
    warnings = [WOULD_DENY + d.message for d in denials]
    warnings += [w for d in denials for w in d.warnings if w not in warnings] + decision.warnings
    return Decision(warnings=warnings, patch=patch.ops, object=patch.result, mutations=mutations,
                    would_deny=[d.reason or "other" for d in denials])


def validate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """The validating webhook under the configured enforcement."""
    return soften(rules.validate(pod, view, config), config)


def admit(pod: Any, view: ClusterView, config: Config) -> Decision:
    """Both pod webhooks as the API server calls them, under the configured enforcement."""
    if config.enforcement != WARN:
        return rules.admit(pod, view, config)
    if rules.ignores_mutation(pod):
        return soften(rules.admit(pod, view, config), config)
    mutated = mutate(pod, view, config)
    if not mutated.allowed:
        return mutated
    return merge(mutated, validate(mutated.object, view, config))


def merge(mutated: Decision, checked: Decision) -> Decision:
    """The mutating answer followed by the validating one, each warning once (as kubectl prints them)."""
    if not checked.allowed:
        checked.warnings = mutated.warnings + [w for w in checked.warnings if w not in mutated.warnings]
        return checked
    new = [w for w in checked.warnings if w not in mutated.warnings]
    if checked.would_deny and _would_deny(checked)[-1] in new:  # not the same denial the mutation warned of
        mutated.would_deny += checked.would_deny
    mutated.warnings += new
    return mutated


def _would_deny(decision: Decision) -> list[str]:
    return [w for w in decision.warnings if w.startswith(WOULD_DENY)]


def _parts(pod: Any) -> int:
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return 0
    return sum(len(spec.get(g) or []) for g in ("initContainers", "containers") if isinstance(spec.get(g), list))


def _set_aside(pod: Any, denial: Decision, view: ClusterView, config: Config) -> Any:
    """A copy of `pod` without the part `denial` is about, or None when no part explains it.

    Each candidate copy leaves out one thing; the first whose answer no longer carries the denial's
    message is the one. Containers are tried last first, so that of containers that cannot share one card
    the first ones keep their mutation.
    """
    for candidate in _candidates(pod, config):
        again = rules.mutate(candidate, view, config)
        if again.allowed or again.message != denial.message:
            return candidate
    return None


def _candidates(pod: dict, config: Config) -> Iterator[dict]:
    spec = pod["spec"]
    if spec.get("nodeName"):
        yield _edited(pod, lambda p: p["spec"].pop("nodeName"))
    groups = [(g, i, c) for g in ("initContainers", "containers")
              for i, c in enumerate(spec.get(g) or []) if isinstance(c, dict)]
    if any(isinstance(c.get("securityContext"), dict) and c["securityContext"].get("privileged") is True
           for _, _, c in groups):
        yield _edited(pod, lambda p: [c["securityContext"].pop("privileged") for g, i, c in _containers(p)
                                      if isinstance(c.get("securityContext"), dict)
                                      and c["securityContext"].get("privileged") is True])
    annotations = (pod.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict) and any(a in annotations for a in config.bind_annotations):
        yield _edited(pod, lambda p: [p["metadata"]["annotations"].pop(a) for a in config.bind_annotations
                                      if a in p["metadata"]["annotations"]])
    for group, index, container in reversed(groups):
        resources = container.get("resources")
        if isinstance(resources, dict) and any(isinstance(resources.get(part), dict) and
                                               any(r in resources[part] for r in config.slices)
                                               for part in ("limits", "requests")):
            yield _edited(pod, lambda p, g=group, i=index: _drop_slices(p["spec"][g][i], config))


def _containers(pod: dict) -> Iterator[tuple[str, int, dict]]:
    for group in ("initContainers", "containers"):
        for index, container in enumerate(pod["spec"].get(group) or []):
            if isinstance(container, dict):
                yield group, index, container


def _drop_slices(container: dict, config: Config) -> None:
    for part in ("limits", "requests"):
        values = container["resources"].get(part)
        if isinstance(values, dict):
            for resource in config.slices:
                values.pop(resource, None)


def _edited(pod: dict, edit: Callable[[dict], object]) -> dict:
    out = copy.deepcopy(pod)
    edit(out)
    return out


def _path(pod: Any, pointer: str) -> tuple[str | int, ...]:
    """An RFC 6901 pointer of the rules' patch back as a path, list indexes as ints (read against `pod`)."""
    out: list[str | int] = []
    node = pod
    for raw in pointer.split("/")[1:]:
        key: str | int = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            key = int(key)
            node = node[key] if key < len(node) else None
        else:
            node = node.get(key) if isinstance(node, dict) else None
        out.append(key)
    return tuple(out)


def _rewrites_scheduler(pod: Any, config: Config) -> bool:
    """§4.10: the scheduler rewrite is made whatever else is denied, for a pod that asks for slices."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return False
    scheduler = spec.get("schedulerName") or ""
    if scheduler not in ("", rules.DEFAULT_SCHEDULER, *config.retired_schedulers):
        return False
    return any(isinstance(c.get("resources"), dict) and
               any(isinstance(c["resources"].get(part), dict) and any(r in c["resources"][part] for r in config.slices)
                   for part in ("limits", "requests"))
               for _, _, c in _containers(pod))
