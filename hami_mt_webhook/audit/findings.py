"""What admission never saw, judged by the steps admission uses: one judgement for the audit and `doctor`.

Admission judges what is created from now on. What already exists is judged here: every pod not finished (one
created before the install or while the webhook was unreachable, in a namespace the webhooks skip, naming a
retired scheduler, or with values admission would refuse), every workload's pod templates (applied before
the install, or while its namespace was in warn mode), and every node whose per-card report is no card size.

A pod is judged as it was created: what binding and the scheduler add later (`spec.nodeName`, the bind-time
annotations, the status) is set aside, and the rest goes through both pod webhooks as the API server would
call them (`admission.enforcement.admit_pod`) under its namespace's mode; a workload goes through
`admission.workloads.check`. A denial is a failure under `deny` and a warning under `warn`; a slice pod not
on the configured scheduler is a failure whatever the mode (it is outside HAMi's accounting until it is
recreated). Pure: plain dicts in, results out; nothing reads the network or the clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..admission.chart import flag_and_value
from ..admission.enforcement import admit_pod
from ..admission.workloads import check as check_workload
from ..rules import templates
from ..rules.capacity import ClusterView, NodeReport, report
from ..rules.config import CARD_SIZES, CORES_PER_CARD, Config
from ..rules.quantities import QuantityError, whole
from ..rules.shape import asks_for_slices
from .objects import Obj, Subject, controller_of, mapping, metadata, name_of, namespace_of
from .registrations import Modes

__all__ = ["CAPACITY_RULE", "FAIL", "MIGRATION", "SCHEDULER_RULE", "WARN", "Audit", "Auditing", "NotReady", "Result",
           "Snapshot", "audit", "counted"]

PASS, WARN, FAIL = "pass", "warn", "fail"
#: The handlers whose registrations give a pod's and a workload's namespace its mode.
POD_HANDLER, WORKLOAD_HANDLER = "mutate-pods", "validate-workloads"
MIGRATION = "docs/migration.md"
#: The rule of a slice pod's scheduler finding, and of a node's capacity finding (the others are named by the
#: reason admission gives for its denial: `quantity`, `mixing`, ...).
SCHEDULER_RULE, CAPACITY_RULE = "slice-pods", "capacity"
#: Where advice says to add a card size: the flag, and the chart value that sets it.
MEMORY_PER_CARD = flag_and_value("--memory-per-card")


class NotReady(Exception):
    """The node view is not read yet, so admission's fills cannot be judged: the pass is tried again later."""


@dataclass(frozen=True)
class Result:
    """One finding: which rule, about which object, what admission would say, and pass/warn/fail."""

    rule: str
    subject: Subject
    result: str
    message: str


@dataclass
class Snapshot:
    """What one pass read: pods not finished, workloads (each object with its `kind` and `apiVersion`, as a
    list returns them once the caller sets them), namespaces, nodes, and the webhook configurations."""

    pods: list[Obj] = field(default_factory=list)
    workloads: list[Obj] = field(default_factory=list)
    namespaces: list[Obj] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    configurations: list[Obj] = field(default_factory=list)


@dataclass
class Audit:
    """A pass's results, and how many objects of each namespace ("" for nodes) were judged with none."""

    results: list[Result] = field(default_factory=list)
    passed: Counter[str] = field(default_factory=Counter)
    judged: int = 0


class Auditing:
    """A pass in progress: objects are judged as they are read, a page at a time, into `result` (a pass never
    holds every pod of a large cluster at once). NotReady while `view` is not read."""

    def __init__(self, namespaces: Iterable[Obj], configurations: Iterable[Obj], view: ClusterView,
                 config: Config) -> None:
        if not view.ready:
            raise NotReady("the node view is not read yet")
        self.modes = Modes.of(configurations, config)
        self.namespaces = {name_of(n): n for n in namespaces}
        self.view, self.config = view, config
        self.result = Audit()

    def _add(self, namespace: str, results: list[Result] | None) -> list[Result]:
        if results is None:
            return []
        self.result.judged += 1
        self.result.results.extend(results)
        if not results:
            self.result.passed[namespace] += 1
        return results

    def pod(self, pod: Obj) -> list[Result]:
        ns = namespace_of(pod)
        return self._add(ns, pod_results(pod, self.modes, self.namespaces.get(ns, ns), self.view, self.config))

    def workload(self, workload: Obj) -> list[Result]:
        ns = namespace_of(workload)
        mode = self.modes.mode(self.namespaces.get(ns, ns), WORKLOAD_HANDLER)
        return self._add(ns, workload_results(workload, mode, self.view))

    def node(self, node: Obj) -> list[Result]:
        return self._add("", node_results(node, self.config))

    def view_nodes(self, unreadable: Mapping[str, tuple[object, object]] | None = None) -> None:
        """The nodes as the node view holds them (its reports), and those it keeps aside as no sliced card's
        (`unreadable`: name -> the sgpu-core and sgpu-memory they reported)."""
        for r in self.view:
            self.view_node(r)
        self.view_nodes_aside(unreadable)

    def view_nodes_aside(self, unreadable: Mapping[str, tuple[object, object]] | None) -> None:
        """The nodes the view keeps aside as no sliced card's."""
        for name, (core, memory) in (unreadable or {}).items():
            self._add("", capacity_results(name, "", None, core, memory, self.config))

    def view_node(self, r: NodeReport) -> list[Result]:
        """One report of the node view (a caller that judges them a slice at a time)."""
        return self._add("", capacity_results(r.name, "", r.per_card, None, None, self.config))


def audit(snapshot: Snapshot, view: ClusterView, config: Config) -> Audit:
    """Every pod, workload and node of `snapshot` judged; NotReady while `view` is not."""
    auditing = Auditing(snapshot.namespaces, snapshot.configurations, view, config)
    for pod in snapshot.pods:
        auditing.pod(pod)
    for workload in snapshot.workloads:
        auditing.workload(workload)
    for node in snapshot.nodes:
        auditing.node(node)
    return auditing.result


def as_created(pod: Mapping[str, Any], config: Config) -> Obj:
    """The pod as its creator asked for it: without what binding and the scheduler wrote after (the node's
    name, the bind-time annotations, the status), which admission refuses on a new pod."""
    meta = dict(metadata(pod))
    annotations = mapping(meta.get("annotations"))
    if any(a in annotations for a in config.bind_annotations):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in config.bind_annotations}
    spec = dict(mapping(pod.get("spec")))
    spec.pop("nodeName", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pod_results(pod: Obj, modes: Modes, namespace: Mapping[str, Any] | str, view: ClusterView,
                config: Config) -> list[Result] | None:
    """A pod's findings; None for a pod that asks for no slices (HAMi does not account for it) or is being
    deleted. Admission's verdict where a registration selects its namespace, and its scheduler's."""
    if metadata(pod).get("deletionTimestamp") or not asks_for_slices(pod, config):
        return None
    subject = Subject.of(pod, "Pod", "v1")
    mode = modes.mode(namespace, POD_HANDLER)
    results = []
    if mode is not None:
        decision = admit_pod(as_created(pod, config), view, mode)
        if decision.reason == "not-ready":
            raise NotReady(decision.message)
        if not decision.allowed:
            results.append(Result(decision.reason or "other", subject, FAIL, decision.message))
        prefix = "would deny: "
        denied = [w.removeprefix(prefix) for w in decision.warnings if w.startswith(prefix)]
        results += [Result(rule, subject, WARN, message) for rule, message in
                    zip(decision.would_deny, denied, strict=False)]  # in the same order; a reason once
    scheduler = scheduler_result(pod, mode is None, config)
    return results + ([scheduler] if scheduler is not None else [])


def _recreate(pod: Mapping[str, Any]) -> str:
    owner = controller_of(pod)
    delete = f"kubectl -n {namespace_of(pod)} delete pod {name_of(pod)}"
    if owner:
        return (f"recreate it: {delete} (its {owner.get('kind')} {owner.get('name')} creates it again "
                "through the webhook)")
    return f"recreate it: {delete}, then create it again from its manifest"


def scheduler_result(pod: Obj, skipped: bool, config: Config) -> Result | None:
    """A slice pod not on the configured scheduler: created before the webhook or while it was down, in a
    namespace the webhooks skip (`skipped`), or naming a retired scheduler; each with its fix. One naming
    another scheduler the webhook leaves alone is a warning: it may be deliberate."""
    name = mapping(pod.get("spec")).get("schedulerName") or "default-scheduler"
    if name == config.scheduler_name or not asks_for_slices(pod, config):
        return None
    subject = Subject.of(pod, "Pod", "v1")
    if name in config.retired_schedulers:
        return Result(SCHEDULER_RULE, subject, FAIL,
                      f"names scheduler {name}, which is retired (--retired-schedulers): nothing will schedule "
                      f"it; {_recreate(pod)}, and remove schedulerName from its manifest")
    if name != "default-scheduler":
        return Result(SCHEDULER_RULE, subject, WARN,
                      f"asks for slices on scheduler {name}, which the webhook leaves alone: if {name} does not "
                      f"account for HAMi's slices, {_recreate(pod)} without schedulerName; once {name} no "
                      f"longer runs, list it in {flag_and_value('--retired-schedulers')} ({MIGRATION})")
    if skipped:
        return Result(SCHEDULER_RULE, subject, FAIL,
                      f"asks for slices in namespace {namespace_of(pod)}, which the webhooks skip, so it is on "
                      "default-scheduler, outside HAMi's accounting: run slice workloads in another namespace "
                      "(docs/operating.md#who-may-switch-the-checks-off)")
    return Result(SCHEDULER_RULE, subject, FAIL,
                  "asks for slices on default-scheduler, outside HAMi's accounting (created before the webhook "
                  f"was installed, or while it was unreachable); {_recreate(pod)}")


def workload_results(workload: Obj, mode: Config | None, view: ClusterView) -> list[Result] | None:
    """A workload's findings: what creating its pods would get. None for one admission never judges (its
    namespace skipped, a kind not checked) or that another checked kind owns (a Deployment's ReplicaSets, a
    CronJob's Jobs: their owner's template is judged), and for one whose templates ask for no slices."""
    kind = templates.of(workload)
    if kind is None or mode is None or metadata(workload).get("deletionTimestamp"):
        return None
    owner = controller_of(workload)
    if owner is not None and templates.find(str(owner.get("kind")),
                                            str(owner.get("apiVersion") or "").rpartition("/")[0]):
        return None
    pods = [templates.pod_of(workload, kind, tpl) for _, tpl in templates.templates(workload, kind)]
    if not any(asks_for_slices(p, mode) for p in pods):
        return None
    decision = check_workload(workload, kind, view, mode)
    if decision.reason == "not-ready":
        raise NotReady(decision.message)
    if decision.allowed:
        return []
    subject = Subject.of(workload, kind.kind, kind.api_versions[0])
    return [Result(decision.reason or "other", subject, WARN if mode.enforcement == "warn" else FAIL,
                   decision.message)]


def node_results(node: Obj, config: Config) -> list[Result] | None:
    """A node's per-card report: a known card size (no finding), an overcommitted one (a warning: it may be
    intended), or one that is no card size or no sliced card at all. None for a node with no sliced cards."""
    caps = mapping(mapping(node.get("status")).get("capacity"))
    if config.core not in caps:
        return None
    r = report(node, config)
    meta = metadata(node)
    return capacity_results(str(meta.get("name") or ""), str(meta.get("uid") or ""),
                            None if r is None else r.per_card, caps.get(config.core), caps.get(config.memory, 0),
                            config)


def unsliced(core: object) -> bool:
    """A node reporting `sgpu-core` 0 (or nothing readable as a count) slices no card: not judged."""
    try:
        return whole(core) == 0
    except QuantityError:
        return False


def capacity_results(name: str, uid: str, per_card: int | None, core: object, memory: object,
                     config: Config) -> list[Result] | None:
    """`node_results` for what the node view keeps of a node: its per-card memory when its report is a sliced
    card's (`per_card`), else the raw capacities it reported. The replicas' audit judges its own view with
    this (no list of 10,000 Nodes each pass), doctor the Nodes it read."""
    subject = Subject("v1", "Node", "", name, uid)
    if per_card is None:
        if unsliced(core):
            return None
        return [Result(CAPACITY_RULE, subject, FAIL,
                       f"reports {config.core} {str(core)[:64]} and {config.memory} {str(memory)[:64]}, which is no "
                       f"sliced-card report ({CORES_PER_CARD} {config.core} a card, at least 2 units of memory a "
                       "card): the webhook and hami-scheduler ignore the node; check the vendor's device plugin and "
                       "sGPU settings on it")]
    if config.known_size(per_card):
        return []
    known = sorted(CARD_SIZES | set(config.memory_per_card))
    below = [k for k in known if k < per_card <= 2 * k]
    if below:
        base = max(below)
        return [Result(CAPACITY_RULE, subject, WARN,
                       f"reports {per_card} units of {config.memory} per card, {per_card / base:.2f} times a "
                       f"{base}-unit card: the vendor's overcommit_ratio is likely in the report, and whole-card "
                       f"fills on it get {per_card}; if that is intended add {per_card} to {MEMORY_PER_CARD} "
                       "and to HAMi's memoryPerCard, else set overcommit_ratio to 1.0 "
                       "(docs/mixed-clusters.md#overcommitted-memory)")]
    return [Result(CAPACITY_RULE, subject, FAIL,
                   f"reports {per_card} units of {config.memory} per card, which is no card size "
                   f"({', '.join(map(str, known))}) nor an overcommitted one: check the node's report (kubectl "
                   f"get node {name} -o jsonpath='{{.status.capacity}}'); if it is right, add "
                   f"{per_card} to {MEMORY_PER_CARD}")]


def counted(results: Iterable[Result]) -> Counter[tuple[str, str]]:
    """Warnings and failures by (rule, namespace): the audit's violations metric."""
    return Counter((r.rule, r.subject.namespace) for r in results if r.result in (WARN, FAIL))
