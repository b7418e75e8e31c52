"""Workload pod templates, checked by the pod rules when the workload is applied (`validate-workloads`).

A pod-only webhook accepts a Deployment whose pods it will refuse: the refusal then shows only as
FailedCreate events on a ReplicaSet. Here the template is turned into the pod a controller would
create and run through mutate-then-validate, so `kubectl apply` is denied with the same message, and
the changes pod creation will make come back as warnings. The workload itself is never patched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import pods as rules
from .capacity import ClusterView
from .config import Config
from .decision import Decision
from .text import clip

#: Kind -> (API group, path of the pod template in the object). Pod templates of other kinds are not checked.
TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Deployment": ("apps", ("spec", "template")),
    "StatefulSet": ("apps", ("spec", "template")),
    "DaemonSet": ("apps", ("spec", "template")),
    "ReplicaSet": ("apps", ("spec", "template")),
    "ReplicationController": ("", ("spec", "template")),
    "Job": ("batch", ("spec", "template")),
    "CronJob": ("batch", ("spec", "jobTemplate", "spec", "template")),
}


def template_path(kind: str) -> str:
    """Where `kind` keeps its pod template, as messages spell it (`spec.jobTemplate.spec.template`)."""
    return ".".join(TEMPLATES[kind][1])


def template(workload: Any, kind: str) -> dict[str, Any] | None:
    """The pod template of `workload`, or None when a step of the path is missing or not an object."""
    node = workload
    for key in TEMPLATES[kind][1]:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, dict) else None


def label(workload: Any, kind: str) -> str:
    """`Deployment "train"`: how messages name the workload."""
    meta = workload.get("metadata") if isinstance(workload, Mapping) else None
    name = (meta.get("name") or meta.get("generateName")) if isinstance(meta, Mapping) else None
    return f'{kind} "{clip(name)}"' if isinstance(name, str) and name else kind


def pod_of(workload: Any, kind: str) -> dict[str, Any] | None:
    """The pod a controller creates from the template, as the pod webhooks would see it.

    The API server defaults `schedulerName` on pods, not on templates, so it is defaulted here; the
    rules do not depend on anything else pod defaulting adds (requests copied from limits are equal).
    """
    tpl = template(workload, kind)
    if tpl is None:
        return None
    meta = tpl.get("metadata")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    outer = workload.get("metadata") if isinstance(workload.get("metadata"), Mapping) else {}
    if outer.get("namespace") and "namespace" not in meta:
        meta["namespace"] = outer["namespace"]
    spec = tpl.get("spec")
    if isinstance(spec, Mapping):
        spec = dict(spec)
        if not spec.get("schedulerName"):
            spec["schedulerName"] = rules.DEFAULT_SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def check(workload: Any, kind: str, view: ClusterView, config: Config, old: Any = None) -> Decision:
    """The validate-workloads answer: deny what pod creation would deny, warn what it would change.

    `old` is the stored object on UPDATE. An update that leaves the template as it was is never denied
    (scaling a Deployment created before this webhook must keep working); it only warns when the
    template's pods would be denied. The decision's object is the workload, unchanged, with no patch.
    """
    name = label(workload, kind)
    pod = pod_of(workload, kind)
    if pod is None:
        return Decision.deny(f"{name} has no pod template at {template_path(kind)}", "malformed", 400, obj=workload)
    decision = rules.admit(pod, view, config)  # a template labelled hami.io/webhook: ignore gets validation only
    if old is not None and template(old, kind) == template(workload, kind):
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
