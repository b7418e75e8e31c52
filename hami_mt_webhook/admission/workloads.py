"""validate-workloads: a workload's pod template gets the verdict its pods would get.

A pod-only webhook accepts a Deployment whose pods it will refuse: the refusal then shows only as
FailedCreate events on a ReplicaSet. Here the template is turned into the pod a controller would
create (rules.workloads) and run through both pod webhooks (`pods.admit`), so `kubectl apply` is denied
with the same message, and the changes pod creation will make come back as warnings. The workload
itself is never patched.
"""

from __future__ import annotations

from typing import Any

from ..rules import workloads
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision
from .pods import admit


def kind_of(request: dict[str, Any]) -> str | None:
    """The request's kind, else its object's (hand-written reviews often leave `request.kind` out); None when
    neither is a string."""
    kind = request.get("kind")
    name = kind.get("kind") if isinstance(kind, dict) else None
    obj = request.get("object")
    if name is None and isinstance(obj, dict):
        name = obj.get("kind")
    return name if isinstance(name, str) else None


def decide_workload(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """validate-workloads: the pod rules on a workload's pod template, on CREATE and UPDATE; never a patch."""
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE") or request.get("subResource"):
        return Decision()
    obj = request.get("object")
    if obj is None:
        return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
    kind = kind_of(request)
    if kind not in workloads.TEMPLATES:
        return Decision()
    old = request.get("oldObject") if operation == "UPDATE" else None
    return check(obj, kind, view, config, old=old)


def check(workload: Any, kind: str, view: ClusterView, config: Config, old: Any = None) -> Decision:
    """The validate-workloads answer: deny what pod creation would deny, warn what it would change.

    `old` is the stored object on UPDATE. An update that leaves the template as it was is never denied
    (scaling a Deployment created before this webhook must keep working); it only warns when the
    template's pods would be denied. The decision's object is the workload, unchanged, with no patch.
    """
    name = workloads.label(workload, kind)
    pod = workloads.pod_of(workload, kind)
    if pod is None:
        return Decision.deny(f"{name} has no pod template at {workloads.template_path(kind)}", "malformed", 400,
                             obj=workload)
    decision = admit(pod, view, config)  # a template labelled hami.io/webhook: ignore gets validation only
    if old is not None and workloads.template(old, kind) == workloads.template(workload, kind):
        if decision.allowed or decision.reason == "not-ready":
            return Decision(object=workload)
        return Decision(object=workload, warnings=[
            f"{name}: the pod template is unchanged, so this update is allowed, but its pods will be denied: "
            f"{decision.message}"])
    if decision.reason == "not-ready":
        # Controllers retry pod creation, and every pod is checked then; holding up the workload helps nobody.
        return Decision(object=workload, warnings=[
            f"{name}: the pod template could not be checked yet (hami-mt-webhook has not read the nodes' sGPU "
            "capacities); its pods are checked when they are created"])
    warnings = [f"{name}: {w}" for w in decision.warnings]
    if not decision.allowed:
        return Decision.deny(f"{name}: {decision.message}", decision.reason, decision.code, obj=workload,
                             warnings=warnings)
    return Decision(object=workload, warnings=warnings)
