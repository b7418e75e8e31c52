"""The pod webhooks as handlers, and the one combinator that chains them as the API server does.

A handler takes an AdmissionReview request and returns a Decision. `in_turn` runs a mutating handler and
then a validating one on what it produced, which is what the API server does with mutate-pods and
validate-pods; the server's table, `review` and the workload check all reach the rules through it or
through the two handlers it chains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..rules import owned
from ..rules import pods as rules
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision

#: A pod rule: the pod being created in, the decision out.
Rule = Callable[[Any, ClusterView, Config], Decision]
#: What a webhook does with one admission request (operation, kind, object, oldObject).
Handler = Callable[[dict[str, Any], ClusterView, Config], Decision]

#: The pod subresource `kubectl debug` writes to; reviewed on UPDATE by validate-pods.
EPHEMERAL = "ephemeralcontainers"
#: The status subresource can change a pod's annotations too (§4.6).
STATUS = "status"


def decide(request: dict[str, Any], rule: Rule, view: ClusterView, config: Config) -> Decision:
    """A pod rule on a request; CREATE of a Pod is all the pod rules look at."""
    if request.get("operation") != "CREATE" or not _is_pod(request):
        return Decision()
    if request.get("subResource"):
        return Decision()
    obj = request.get("object")
    if obj is None:
        return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
    return rule(obj, view, config)


def mutate_pods(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """mutate-pods: fill, snap and copy the slice values of a pod being created."""
    return decide(request, rules.mutate, view, config)


def validate_pods(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """validate-pods: the final pod on CREATE; on UPDATE of a pod or its status, who changed an owned
    annotation (SPEC.md §4.6: the guard's webhook, where no policy holds it); and new ephemeral containers
    on UPDATE of pods/ephemeralcontainers (`kubectl debug`), which only the privilege rule judges (§4.3)."""
    subresource = request.get("subResource") or ""
    if request.get("operation") == "UPDATE" and subresource in ("", STATUS, EPHEMERAL) and _is_pod(request):
        obj = request.get("object")
        if obj is None:
            return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
        info = request.get("userInfo")
        user = info.get("username") if isinstance(info, dict) else None
        guarded = owned.updated(request.get("oldObject"), obj, user, config)
        if not guarded.allowed or subresource != EPHEMERAL:
            return guarded
        return rules.ephemeral(obj, request.get("oldObject"), config)
    return decide(request, rules.validate, view, config)


def _is_pod(request: dict[str, Any]) -> bool:
    kind = request.get("kind")
    return not isinstance(kind, dict) or kind.get("kind") in (None, "Pod")


def join(mutated: Decision, checked: Decision) -> Decision:
    """The mutating answer (its changes, warnings of both), or the validating one's denial with every
    warning."""
    return replace(mutated if checked.allowed else checked, warnings=[*mutated.warnings, *checked.warnings])


def in_turn(mutating: Handler, validating: Handler,
          joined: Callable[[Decision, Decision], Decision] = join) -> Handler:
    """Both webhooks as the API server calls them: the mutating one, then the validating one on its result.

    `joined` makes one answer of the two (`join`; rollout mode has its own). A pod labelled
    `hami.io/webhook: ignore` is outside the mutating webhook's objectSelector, so only the validating one
    sees it, defaulted as the API server would (SPEC.md §4.8).
    """
    def both(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
        obj = request.get("object")
        if rules.ignores_mutation(obj):
            return validating({**request, "object": rules.defaulted(obj)}, view, config)
        mutated = mutating(request, view, config)
        if not mutated.allowed:
            return mutated
        if mutated.object is None:  # the mutating handler did not judge the object (another operation)
            checked = validating(request, view, config)
            return replace(checked, warnings=[*mutated.warnings, *checked.warnings])
        return joined(mutated, validating({**request, "object": mutated.object}, view, config))
    return both


#: What the API server does with both pod webhooks for one request, as the rules decide (under `deny`;
#: `enforcement.admit` adds rollout mode).
admit = in_turn(mutate_pods, validate_pods)


def admit_pod(pod: Any, view: ClusterView, config: Config) -> Decision:
    """Both pod webhooks for a pod being created, as written in a manifest or a workload's template."""
    return admit({"operation": "CREATE", "object": pod}, view, config)
