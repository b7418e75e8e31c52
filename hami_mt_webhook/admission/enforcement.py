"""Rollout mode (SPEC.md §4.10): under `warn`, a rule's denial becomes the warning `would deny: <message>`.

The rules always decide as under `deny`; this layer wraps the pod webhooks' steps (admission.pod_webhooks) and
rewrites their decisions, and `admit` chains the wrapped steps with `pod_webhooks.in_turn`. For the mutating
webhook a warning alone is not enough: the pod must still be mutated as far as the rules can, so that
turning `deny` on later changes nothing but the answer for the pods that were warned about. `mutating`
gets there by asking the step again about a copy of the pod in which each denied part is set aside (a
container's slice resources, the pod's nodeName, a privileged flag, a bind-time annotation), and then
makes the changes the rules give for the copy on the real pod. A container set aside is left as it was
written.

Malformed reviews (code 400) and a webhook not yet ready (503) are answered the same in both modes: only
rule denials (403) are softened.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision, Patch
from ..rules.shape import GROUPS, asks_for_slices, containers, named, privileged, resources
from ..rules.slots import rewritten
from . import pod_webhooks
from .pod_webhooks import Handler, in_turn, mutate_pods, validate_pods

__all__ = ["WOULD_DENY", "admit_pod", "soften"]

WARN = "warn"
#: The prefix of every warning that stands for a denial under `warn`.
WOULD_DENY = "would deny: "


def softened(decision: Decision) -> bool:
    """Whether `decision` is a rule denial, the kind `warn` turns into a warning."""
    return not decision.allowed and decision.code == 403


def soften(decision: Decision, config: Config) -> Decision:
    """Under `warn`, a rule denial as an allowed answer, with no patch and the warning
    `would deny: <message>`."""
    if config.enforcement != WARN or not softened(decision):
        return decision
    return Decision(object=decision.object, warnings=[*decision.warnings, WOULD_DENY + decision.message],
                    would_deny=[decision.reason or "other"])


def validating(step: Handler) -> Handler:
    """A validating step under the configured enforcement: under `warn`, its rule denials are warnings."""
    def warned(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
        return soften(step(request, view, config), config)
    return warned


def mutating(step: Handler) -> Handler:
    """A mutating step under the configured enforcement; under `warn`, as much of the mutation as the rules
    allow, with one `would deny` warning per part set aside."""
    def warned(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
        decision = step(request, view, config)
        if config.enforcement != WARN or not softened(decision):
            return decision
        return _partial(step, request, decision, view, config)
    return warned


def _partial(step: Handler, request: dict[str, Any], decision: Decision, view: ClusterView,
             config: Config) -> Decision:
    pod = request.get("object")
    masked: Any = pod
    denials: list[Decision] = []
    while softened(decision) and len(denials) <= _parts(pod) + 3:  # each round sets one part aside
        denials.append(decision)
        masked = _set_aside(step, request, masked, decision, view, config)
        if masked is None:
            break
        decision = step({**request, "object": masked}, view, config)
    if masked is None or not decision.allowed:  # nothing more can be mutated: warn, and rewrite the scheduler
        decision = Decision(object=pod)
    patch = Patch(pod)
    for change in decision.changes:  # setting parts aside removes keys, never list items: the paths hold
        patch.set(change.path, change.value)
    mutations = list(decision.mutations)
    if not {"scheduler", "retired-scheduler"} & set(mutations) and _rewrites_scheduler(pod, config):
        patch.set(("spec", "schedulerName"), config.scheduler_name)
        mutations.append("scheduler")
    warnings = [WOULD_DENY + d.message for d in denials]
    warnings += [w for d in denials for w in d.warnings if w not in warnings] + decision.warnings
    return Decision(warnings=warnings, changes=patch.changes, object=patch.result, mutations=mutations,
                    would_deny=[d.reason or "other" for d in denials])


def merge(mutated: Decision, checked: Decision) -> Decision:
    """`in_turn`'s join under `warn`: the mutating answer followed by the validating one, each warning once (as
    kubectl prints them), and a denial the mutating step already warned of counted once."""
    new = [w for w in checked.warnings if w not in mutated.warnings]
    if not checked.allowed:
        return replace(checked, warnings=[*mutated.warnings, *new])
    would_deny = mutated.would_deny
    if checked.would_deny and _would_deny(checked)[-1] in new:  # not the same denial the mutation warned of
        would_deny = [*would_deny, *checked.would_deny]
    return replace(mutated, warnings=[*mutated.warnings, *new], would_deny=would_deny)


#: The pod webhooks' steps as the server's table answers them, each under the configured enforcement.
mutate_step = mutating(mutate_pods)
validate_step = validating(validate_pods)
_admit_warned = in_turn(mutate_step, validate_step, merge)


def admit(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """Both pod webhooks for one request, as the API server calls them, under the configured enforcement:
    in rollout mode (`warn`) rule denials are warnings and the pod is still mutated."""
    if config.enforcement != WARN:
        return pod_webhooks.admit(request, view, config)
    return _admit_warned(request, view, config)


def admit_pod(pod: Any, view: ClusterView, config: Config) -> Decision:
    """`admit` for a pod being created."""
    return admit({"operation": "CREATE", "object": pod}, view, config)


def _would_deny(decision: Decision) -> list[str]:
    return [w for w in decision.warnings if w.startswith(WOULD_DENY)]


def _parts(pod: Any) -> int:
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return 0
    return sum(len(items) for g in GROUPS if isinstance(items := spec.get(g), list))


def _set_aside(step: Handler, request: dict[str, Any], pod: Any, denial: Decision, view: ClusterView,
               config: Config) -> Any:
    """A copy of `pod` without the part `denial` is about, or None when no part explains it.

    Each candidate copy leaves out one thing; the first whose answer no longer carries the denial's
    message is the one. Containers are tried last first, so that of containers that cannot share one card
    the first ones keep their mutation.
    """
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return None
    for candidate in _candidates(pod, config):
        again = step({**request, "object": candidate}, view, config)
        if again.allowed or again.message != denial.message:
            return candidate
    return None


def _candidates(pod: dict[str, Any], config: Config) -> Iterator[dict[str, Any]]:
    spec = pod["spec"]
    if spec.get("nodeName"):
        yield _edited(pod, lambda p: p["spec"].pop("nodeName"))
    groups = list(containers(spec))
    if any(privileged(c) for _, _, c in groups):
        yield _edited(pod, _drop_privileged)
    annotations = (pod.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict) and any(a in annotations for a in config.bind_annotations):
        yield _edited(pod, lambda p: [p["metadata"]["annotations"].pop(a) for a in config.bind_annotations
                                      if a in p["metadata"]["annotations"]])
    for group, index, container in reversed(groups):
        if named(config.slices, *resources(container)):
            yield _edited(pod, functools.partial(_drop_slices, config=config, at=(group, index)))


def _drop_privileged(pod: dict[str, Any]) -> None:
    for _, _, container in containers(pod["spec"]):
        if privileged(container):
            container["securityContext"].pop("privileged")


def _drop_slices(pod: dict[str, Any], config: Config, at: tuple[str, int]) -> None:
    for values in resources(pod["spec"][at[0]][at[1]]):
        for resource in config.slices:
            values.pop(resource, None)


def _edited(pod: dict[str, Any], edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    edit(out)
    return out


def _rewrites_scheduler(pod: Any, config: Config) -> bool:
    """§4.10: the scheduler rewrite is made whatever else is denied, for a pod that asks for slices."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return False
    return rewritten(spec.get("schedulerName") or "", config) and asks_for_slices(pod, config)
