"""PolicyReports from the audit's results: one per namespace, written only when a finding changes."""

from __future__ import annotations

from collections import Counter

from hami_mt_webhook.audit.findings import FAIL, WARN, Audit, Result
from hami_mt_webhook.audit.objects import Subject
from hami_mt_webhook.audit.reports import MANAGED, MOST_RESULTS, by_namespace, desired, plan, report


def result(name: str, ns: str = "team", outcome: str = FAIL, message: str = "bad") -> Result:
    return Result("range", Subject("v1", "Pod", ns, name, f"uid-{name}"), outcome, message)


def test_a_report_names_rule_object_message_and_outcome() -> None:
    obj = report("team", [result("b", outcome=WARN), result("a")], passed=3, now=100)
    assert (obj["apiVersion"], obj["kind"]) == ("wgpolicyk8s.io/v1alpha2", "PolicyReport")
    assert obj["metadata"] == {"name": "hami-mt-webhook", "namespace": "team", "labels": {MANAGED[0]: MANAGED[1]}}
    assert obj["summary"] == {"pass": 3, "fail": 1, "warn": 1, "error": 0, "skip": 0}
    first = obj["results"][0]  # failures first
    assert (first["policy"], first["rule"], first["result"], first["message"]) == ("hami-mt-webhook", "range",
                                                                                   "fail", "bad")
    assert first["resources"] == [{"apiVersion": "v1", "kind": "Pod", "namespace": "team", "name": "a",
                                   "uid": "uid-a"}]
    assert first["timestamp"] == {"seconds": 100, "nanos": 0}


def test_the_nodes_report_is_cluster_scoped() -> None:
    node = Result("capacity", Subject("v1", "Node", "", "n1", "u"), FAIL, "no card size")
    obj = report("", [node], passed=0, now=1)
    assert obj["kind"] == "ClusterPolicyReport" and "namespace" not in obj["metadata"]
    assert "namespace" not in obj["results"][0]["resources"][0]


def test_a_finding_keeps_the_time_it_was_first_seen_so_an_unchanged_pass_writes_nothing() -> None:
    audit = Audit([result("a")], Counter(team=2))
    first = desired(audit, now=100, current={})
    stored = {ns: {**obj, "metadata": {**obj["metadata"], "resourceVersion": "7"}} for ns, obj in first.items()}
    again = desired(audit, now=200, current=stored)
    assert again["team"]["results"][0]["timestamp"]["seconds"] == 100
    assert plan(stored, again).write == [] and plan(stored, again).delete == []


def test_a_changed_report_is_replaced_at_its_version_and_a_namespace_left_empty_is_deleted() -> None:
    stored = {ns: {**obj, "metadata": {**obj["metadata"], "resourceVersion": "7"}}
              for ns, obj in desired(Audit([result("a"), result("x", "gone")]), 100, {}).items()}
    fixed = desired(Audit([], Counter(team=1)), now=200, current=stored)  # `a` recreated: it passes now
    changes = plan(stored, fixed)
    [(obj, version)] = changes.write
    assert (obj["metadata"]["namespace"], version, obj["results"], obj["summary"]["pass"]) == ("team", "7", [], 1)
    assert changes.delete == ["gone"]
    new = plan({}, desired(Audit([result("a")]), 1, {}))
    assert [version for _, version in new.write] == [""]  # created


def test_a_report_holds_at_most_so_many_results_and_counts_them_all() -> None:
    many = [result(f"p{i}", outcome=WARN) for i in range(MOST_RESULTS)] + [result("last")]
    obj = report("team", many, passed=0, now=1)
    assert len(obj["results"]) == MOST_RESULTS
    assert obj["results"][0]["resources"][0]["name"] == "last"  # the failure is kept
    assert obj["summary"]["warn"] == MOST_RESULTS and obj["summary"]["fail"] == 1


def test_only_the_audits_own_reports_are_its_own() -> None:
    ours = report("team", [], 1, 1)
    kyverno = {"metadata": {"name": "cpol-require-labels", "namespace": "team"}}
    relabelled = {"metadata": {"name": "hami-mt-webhook", "namespace": "other"}}
    assert by_namespace([ours, kyverno, relabelled]) == {"team": ours}
