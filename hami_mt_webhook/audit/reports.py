"""The audit's results as wgpolicyk8s.io/v1alpha2 PolicyReports, and which reports a pass must write.

One `PolicyReport` per namespace that holds something judged, and one `ClusterPolicyReport` for the nodes,
each named `REPORT` and labelled `MANAGED` (the audit lists only its own, and never touches Kyverno's). A
result names the rule, the object, admission's message and pass/warn/fail; objects judged with no finding
are counted in `summary.pass` only, so a report changes (and is written) only when a finding comes, goes or
changes, not whenever pods come and go. A finding keeps the time it was first seen across passes. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .findings import FAIL, WARN, Audit, Result
from .objects import Obj, mapping, metadata, name_of, namespace_of, sequence

__all__ = ["API_VERSION", "MANAGED", "REPORT", "by_namespace", "desired", "plan"]

GROUP = "wgpolicyk8s.io"
API_VERSION = f"{GROUP}/v1alpha2"
#: Every report's name, and the policy and source its results name.
REPORT = POLICY = SOURCE = "hami-mt-webhook"
#: The label that marks a report as the audit's own.
MANAGED = ("app.kubernetes.io/managed-by", "hami-mt-webhook")
#: Results a report holds at most, failures first: etcd refuses an object over 1.5 MiB, and a result is about
#: 600 bytes. The summary counts them all.
MOST_RESULTS = 1000
CATEGORY = "HAMi sGPU"
#: How severe each outcome is, for tools that sort by it.
SEVERITY = {FAIL: "high", WARN: "medium"}


def _key(result: Mapping[str, Any]) -> tuple[str, str, str]:
    """A result's identity across passes: its rule, its object's uid (or name) and its message."""
    resources = sequence(result.get("resources"))
    first = mapping(resources[0]) if resources else {}
    return (str(result.get("rule")), str(first.get("uid") or first.get("name")), str(result.get("message")))


def _entry(result: Result, seconds: int) -> Obj:
    return {"policy": POLICY, "rule": result.rule, "result": result.result, "message": result.message,
            "source": SOURCE, "scored": True, "severity": SEVERITY.get(result.result, "info"),
            "category": CATEGORY, "timestamp": {"seconds": seconds, "nanos": 0},
            "resources": [result.subject.reference()]}


def report(namespace: str, results: Iterable[Result], passed: int, now: int,
           before: Mapping[str, Any] | None = None) -> Obj:
    """The report of `namespace` ("" for the ClusterPolicyReport of the nodes); results already in `before`
    keep the time they were first seen."""
    seen = {_key(r): mapping(r.get("timestamp")).get("seconds") for r in sequence((before or {}).get("results"))
            if isinstance(r, dict)}
    ordered = sorted(results, key=lambda r: (r.result != FAIL, r.subject.name, r.rule, r.message))
    entries = []
    for result in ordered:
        entry = _entry(result, now)
        first = seen.get(_key(entry))
        if isinstance(first, int):
            entry["timestamp"]["seconds"] = first
        entries.append(entry)
    counts = Counter(r.result for r in ordered)
    meta: Obj = {"name": REPORT, "labels": {MANAGED[0]: MANAGED[1]}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": "PolicyReport" if namespace else "ClusterPolicyReport",
            "metadata": meta,
            "summary": {"pass": passed, "fail": counts[FAIL], "warn": counts[WARN], "error": 0, "skip": 0},
            "results": entries[:MOST_RESULTS]}


def desired(result: Audit, now: int, current: Mapping[str, Obj]) -> dict[str, Obj]:
    """The report each namespace should have after this pass ("" the cluster's), by namespace."""
    by_namespace: dict[str, list[Result]] = {}
    for r in result.results:
        by_namespace.setdefault(r.subject.namespace, []).append(r)
    namespaces = set(by_namespace) | {ns for ns, n in result.passed.items() if n}
    return {ns: report(ns, by_namespace.get(ns, ()), result.passed[ns], now, current.get(ns)) for ns in namespaces}


def _content(obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return obj.get("summary"), obj.get("results") or [], mapping(metadata(obj).get("labels")).get(MANAGED[0])


@dataclass(frozen=True)
class Plan:
    """What a pass writes: reports to create or replace (each with the resourceVersion it replaces, "" to
    create), and the namespaces whose report is to be deleted."""

    write: list[tuple[Obj, str]]
    delete: list[str]


def plan(current: Mapping[str, Obj], wanted: Mapping[str, Obj]) -> Plan:
    """The writes that turn the audit's `current` reports (by namespace) into `wanted`: none for a report
    whose summary and results are unchanged, a delete for one whose namespace has nothing judged now."""
    write = []
    for ns, obj in sorted(wanted.items()):
        old = current.get(ns)
        if old is not None and _content(old) == _content(obj):
            continue
        version = str(metadata(old).get("resourceVersion") or "") if old is not None else ""
        write.append((obj, version))
    return Plan(write, sorted(ns for ns in current if ns not in wanted))


def by_namespace(reports: Iterable[Obj]) -> dict[str, Obj]:
    """The audit's own reports among `reports`, by namespace ("" for the cluster's)."""
    return {namespace_of(r): r for r in reports
            if name_of(r) == REPORT and mapping(metadata(r).get("labels")).get(MANAGED[0]) == MANAGED[1]}
