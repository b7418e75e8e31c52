"""Workload pod templates: where each kind keeps one, and the pod a controller would create from it.

`validate-workloads` (admission.workloads) runs each template's pod through both pod webhooks, so a
workload whose pods would be refused is refused when it is applied.

`KINDS` is the one table of what is checked and where each kind keeps its templates: the handler, the
offline `review`, and the workload webhook's rules and matchConditions (generated from it, and checked
against it by the tests) all read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .slots import DEFAULT_SCHEDULER
from .text import clip

__all__ = ["KINDS", "Kind", "LIST", "MAP", "find", "label", "of", "pod_of", "steps", "template",
           "template_path", "templates"]

#: A step of a template path that stands for every value of a map (`.*`) or every item of a list (`[*]`).
MAP, LIST = ".*", "[*]"


@dataclass(frozen=True)
class Kind:
    """A kind whose objects carry pod templates, and where."""

    kind: str
    group: str
    versions: tuple[str, ...]
    resource: str  # the plural, as the webhook configuration's rules name it
    #: Paths of the pod templates, as SPEC.md §7 writes them: `spec.template`,
    #: `spec.pytorchReplicaSpecs.*.template`, `spec.workerGroupSpecs[*].template` (one wildcard at most).
    paths: tuple[str, ...]
    #: Where the kind names its pods' scheduler at the job level (Volcano Job's `spec.schedulerName`).
    scheduler: str | None = None
    #: A built-in kind; the others are custom resources whose CRDs may be absent.
    builtin: bool = False

    @property
    def api_versions(self) -> tuple[str, ...]:
        return tuple(f"{self.group}/{v}" if self.group else v for v in self.versions)


def _builtin(kind: str, group: str, path: str = "spec.template") -> Kind:
    return Kind(kind, group, ("v1",), kind.lower() + "s", (path,), builtin=True)


#: Every kind whose pod templates are checked. Built-in kinds first: a bare kind name means the built-in one.
KINDS: tuple[Kind, ...] = (
    _builtin("Deployment", "apps"),
    _builtin("StatefulSet", "apps"),
    _builtin("DaemonSet", "apps"),
    _builtin("ReplicaSet", "apps"),
    _builtin("ReplicationController", ""),
    _builtin("Job", "batch"),
    _builtin("CronJob", "batch", "spec.jobTemplate.spec.template"),
    Kind("PyTorchJob", "kubeflow.org", ("v1",), "pytorchjobs", ("spec.pytorchReplicaSpecs.*.template",)),
    # kubeflow.org/v1 is the training operator's MPIJob, v2beta1 the MPI operator's; both keep templates here.
    Kind("MPIJob", "kubeflow.org", ("v1", "v2beta1"), "mpijobs", ("spec.mpiReplicaSpecs.*.template",)),
    Kind("RayCluster", "ray.io", ("v1",), "rayclusters",
         ("spec.headGroupSpec.template", "spec.workerGroupSpecs[*].template")),
    Kind("RayJob", "ray.io", ("v1",), "rayjobs",
         ("spec.rayClusterSpec.headGroupSpec.template", "spec.rayClusterSpec.workerGroupSpecs[*].template")),
    Kind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", ("v1",), "leaderworkersets",
         ("spec.leaderWorkerTemplate.leaderTemplate", "spec.leaderWorkerTemplate.workerTemplate")),
    Kind("JobSet", "jobset.x-k8s.io", ("v1alpha2",), "jobsets",
         ("spec.replicatedJobs[*].template.spec.template",)),
    Kind("Job", "batch.volcano.sh", ("v1alpha1",), "jobs", ("spec.tasks[*].template",),
         scheduler="spec.schedulerName"),
)

_BY_GROUP = {(k.group, k.kind): k for k in KINDS}
_BY_NAME = {k.kind: k for k in reversed(KINDS)}  # the first of a name wins: the built-in Job


def find(kind: str | Kind | None, group: str | None = None) -> Kind | None:
    """The entry for `kind` in `group`; without a group, the built-in kind of that name, else the only one."""
    if isinstance(kind, Kind) or kind is None:
        return kind
    if group is None:
        return _BY_NAME.get(kind)
    return _BY_GROUP.get((group, kind))


def of(obj: Any) -> Kind | None:
    """The entry for an object, by its apiVersion's group and its kind."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("kind"), str):
        return None
    api_version = obj.get("apiVersion")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else None
    return find(obj["kind"], group)


def steps(path: str) -> list[str]:
    """`spec.workerGroupSpecs[*].template` as ["spec", "workerGroupSpecs", "[*]", "template"]."""
    out: list[str] = []
    for part in path.replace(LIST, "." + LIST).split("."):
        out.append(MAP if part == "*" else part)
    return out


def template_path(kind: str | Kind) -> str:
    """Where `kind` keeps its pod templates, as messages spell it (`spec.jobTemplate.spec.template`)."""
    entry = find(kind)
    assert entry is not None, kind
    return " and ".join(entry.paths)


def templates(workload: Any, kind: str | Kind) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each pod template of `workload` with its path (`spec.workerGroupSpecs[1].template`); steps that are
    missing or not of the expected shape are passed over."""
    entry = find(kind)
    assert entry is not None, kind
    for path in entry.paths:
        yield from _walk(workload, steps(path), "")


def _walk(node: Any, rest: list[str], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not rest:
        if isinstance(node, dict):
            yield where, node
        return
    step, rest = rest[0], rest[1:]
    if step == MAP:
        for key, value in node.items() if isinstance(node, Mapping) else ():
            yield from _walk(value, rest, f"{where}.{key}")
    elif step == LIST:
        for index, value in enumerate(node if isinstance(node, list) else ()):
            yield from _walk(value, rest, f"{where}[{index}]")
    elif isinstance(node, Mapping):
        yield from _walk(node.get(step), rest, f"{where}.{step}" if where else step)


def template(workload: Any, kind: str | Kind) -> dict[str, Any] | None:
    """The first pod template of `workload`, or None when it has none."""
    return next((tpl for _, tpl in templates(workload, kind)), None)


def label(workload: Any, kind: str | Kind) -> str:
    """`Deployment "train"`: how messages name the workload."""
    name_of = kind.kind if isinstance(kind, Kind) else kind
    meta = workload.get("metadata") if isinstance(workload, Mapping) else None
    name = (meta.get("name") or meta.get("generateName")) if isinstance(meta, Mapping) else None
    return f'{name_of} "{clip(name)}"' if isinstance(name, str) and name else name_of


def _job_scheduler(workload: Any, entry: Kind) -> str | None:
    if entry.scheduler is None:
        return None
    node = workload
    for key in entry.scheduler.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, str) and node else None


def pod_of(workload: Any, kind: str | Kind, tpl: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The pod a controller creates from a template (default: the first), as the pod webhooks would see it.

    The API server defaults `schedulerName` on pods, not on templates, so it is defaulted here: to the
    job-level scheduler where the kind has one and the template names none (Volcano's controller does so),
    else to the default scheduler. The rules depend on nothing else pod defaulting adds.
    """
    entry = find(kind)
    assert entry is not None, kind
    tpl = template(workload, entry) if tpl is None else tpl
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
            spec["schedulerName"] = _job_scheduler(workload, entry) or DEFAULT_SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
