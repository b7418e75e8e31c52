"""What the audit judges, as doctor's findings: read off the audit's PolicyReports where the replicas publish
them, else judged here by the same judgement (`audit.findings`) over what doctor read, so both say the same."""

from __future__ import annotations

from ..audit.findings import CAPACITY_RULE, FAIL, SCHEDULER_RULE, Result, Snapshot, audit
from ..audit.objects import Subject, mapping, sequence
from ..rules.capacity import ClusterView
from .model import Cluster, Finding, Settings, live_pods


def results(cluster: Cluster, settings: Settings) -> list[Result]:
    """The audit's findings: its reports' results when there are any, else `audit.findings` over `cluster`."""
    if cluster.reports:
        return [_result(r) for report in cluster.reports for r in sequence(report.get("results"))
                if isinstance(r, dict)]
    snapshot = Snapshot(pods=live_pods(cluster),
                        workloads=[{"apiVersion": "apps/v1", "kind": "Deployment", **d} for d in cluster.deployments],
                        namespaces=cluster.namespaces, nodes=cluster.nodes,
                        configurations=cluster.mutating + cluster.validating)
    return audit(snapshot, ClusterView.from_nodes(cluster.nodes, settings.config), settings.config).results


def _result(entry: dict[str, object]) -> Result:
    resources = sequence(entry.get("resources"))
    ref = mapping(resources[0]) if resources else {}
    subject = Subject(str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""), str(ref.get("namespace") or ""),
                      str(ref.get("name") or ""), str(ref.get("uid") or ""))
    return Result(str(entry.get("rule") or ""), subject, str(entry.get("result") or ""), str(entry.get("message")))


def _findings(check: str, found: list[Result]) -> list[Finding]:
    return [Finding(check, r.subject.label(), r.message, action=r.result == FAIL) for r in found]


def slice_pods(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Slice pods not on the configured scheduler: created before the webhook or while it was down, in a
    namespace the webhooks skip, or naming a retired scheduler; each with its fix."""
    return _findings("slice-pods", [r for r in results(cluster, settings) if r.rule == SCHEDULER_RULE])


def capacity(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Per-card capacities: a known card size, an overcommitted one, or a report that is no sliced card."""
    return _findings("capacity", [r for r in results(cluster, settings) if r.rule == CAPACITY_RULE])


def admission(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Existing pods and workloads admission would refuse now (a warning in a namespace in warn mode)."""
    return _findings("admission", [r for r in results(cluster, settings)
                                   if r.rule not in (SCHEDULER_RULE, CAPACITY_RULE)])
