"""validate-workloads: a workload's pod template gets the verdict its pods would get.

A pod-only webhook accepts a Deployment whose pods it will refuse: the refusal then shows only as
FailedCreate events on a ReplicaSet. Here the template is turned into the pod a controller would
create (rules.templates) and run through both pod webhooks (`pod_webhooks.admit_pod`), so
`kubectl apply` is denied with the same message, and the changes pod creation will make come back as
warnings. The workload itself is never patched. Training jobs (a launcher and workers) get each of their
templates checked.
"""

from __future__ import annotations

from typing import Any

from ..rules import templates
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision
from . import enforcement
from .pod_webhooks import admit_pod

__all__ = ["check"]


def kind_of(request: dict[str, Any]) -> str | None:
    """The request's kind, else its object's (hand-written reviews often leave `request.kind` out); None when
    neither is a string."""
    kind = request.get("kind")
    name = kind.get("kind") if isinstance(kind, dict) else None
    obj = request.get("object")
    if name is None and isinstance(obj, dict):
        name = obj.get("kind")
    return name if isinstance(name, str) else None


def workload_kind(request: dict[str, Any]) -> templates.Kind | None:
    """The workload table's entry for the request: by `request.kind`'s group and kind, else by the
    object's."""
    kind = request.get("kind")
    if isinstance(kind, dict) and isinstance(kind.get("kind"), str):
        group = kind.get("group")
        return templates.find(kind["kind"], group if isinstance(group, str) else "")
    return templates.of(request.get("object"))


def decide_workload(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """validate-workloads: the pod rules on a workload's pod templates, on CREATE and UPDATE; never a patch.
    Under `warn` (SPEC.md §4.10) its denial is a warning."""
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE") or request.get("subResource"):
        return Decision()
    obj = request.get("object")
    if obj is None:
        return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
    kind = workload_kind(request)
    if kind is None:
        return Decision()
    old = request.get("oldObject") if operation == "UPDATE" else None
    return enforcement.soften(check(obj, kind, view, config, old=old), config)


def check(workload: Any, kind: str | templates.Kind, view: ClusterView, config: Config,
          old: Any = None) -> Decision:
    """The validate-workloads answer under `deny`: deny what pod creation would deny, warn what it would
    change.

    `old` is the stored object on UPDATE. An update that leaves the templates as they were is never denied
    (scaling a Deployment created before this webhook must keep working); it only warns when the
    templates' pods would be denied. The decision's object is the workload, unchanged, with no patch.
    A kind with several templates (a training job's launcher and workers) names the template in each
    message; the first template whose pods would be denied decides.
    """
    entry = templates.find(kind)
    assert entry is not None, kind
    name = templates.label(workload, entry)
    found = list(templates.templates(workload, entry))
    if not found:
        return Decision.deny(f"{name} has no pod template at {templates.template_path(entry)}", "malformed",
                             400, obj=workload)
    named = len(entry.paths) > 1 or any(templates.MAP in p or templates.LIST in p for p in entry.paths)
    warnings: list[str] = []
    denial: Decision | None = None
    waiting = False
    for where, tpl in found:
        pod = templates.pod_of(workload, entry, tpl)
        # a template labelled hami.io/webhook: ignore: validation only
        decision = admit_pod(pod, view, config)
        prefix = f"{name}: {where}" if named else name
        if decision.reason == "not-ready":
            waiting = True
            continue
        warnings += [f"{prefix}: {w}" for w in decision.warnings]
        if not decision.allowed and denial is None:
            denial = Decision.deny(f"{prefix}: {decision.message}", decision.reason, decision.code,
                                   obj=workload)
    if old is not None and list(templates.templates(old, entry)) == found:
        if denial is None:
            return Decision(object=workload)
        return Decision(object=workload, warnings=[
            f"{name}: the pod template is unchanged, so this update is allowed, but its pods will be denied: "
            f"{denial.message[len(name) + 2:]}"])
    if denial is not None:
        denial.warnings = warnings
        return denial
    if waiting:
        # Controllers retry pod creation, and every pod is checked then; holding up the workload helps nobody.
        warnings.append(f"{name}: the pod template could not be checked yet (hami-mt-webhook has not read "
                        "the nodes' sGPU capacities); its pods are checked when they are created")
    return Decision(object=workload, warnings=warnings)
