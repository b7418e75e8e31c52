"""Workload pod templates: where each kind keeps one, and the pod a controller would create from it.

`validate-workloads` (admission.workloads) runs that pod through both pod webhooks, so a workload
whose pods would be refused is refused when it is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .slots import DEFAULT_SCHEDULER
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
            spec["schedulerName"] = DEFAULT_SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
