"""The audit loop's pure parts: how often an Event may be sent, how requests are counted, what an Event says;
its reads, writes and Lease run against a real API server in tests/e2e/test_audit.py."""

from __future__ import annotations

import gc

import pytest

from hami_mt_webhook.audit.findings import FAIL, WARN, Result
from hami_mt_webhook.audit.objects import Subject
from hami_mt_webhook.service.audit import (
    FULL_COLLECTIONS_RARER,
    EventLimit,
    _event,
    _rare_full_collections,
    _resource,
)
from hami_mt_webhook.service.metrics import Metrics


def finding(name: str, message: str = "too many cores", outcome: str = FAIL) -> Result:
    return Result("range", Subject("apps/v1", "Deployment", "team", name, f"uid-{name}"), outcome, message)


def test_the_same_finding_on_the_same_workload_is_sent_once_per_period() -> None:
    limit = EventLimit(every=3600, per_pass=20)
    assert limit.due([finding("a"), finding("b")], now=0) == [finding("a"), finding("b")]
    assert limit.due([finding("a"), finding("b")], now=60) == []           # a retry loop sends nothing more
    assert limit.due([finding("a", "another message")], now=61) == [finding("a", "another message")]
    assert limit.due([finding("a")], now=3601) == [finding("a")]          # a period later, once again


def test_a_pass_sends_at_most_so_many_events() -> None:
    limit = EventLimit(every=3600, per_pass=3)
    many = [finding(f"w{i}") for i in range(10)]
    assert len(limit.due(many, now=0)) == 3
    assert len(limit.due(many, now=1)) == 3  # the rest come in the next passes


def test_requests_are_counted_by_the_resource_they_name() -> None:
    assert _resource("/api/v1/pods") == "pods"
    assert _resource("/api/v1/namespaces") == "namespaces"
    assert _resource("/api/v1/namespaces/team/events") == "events"
    assert _resource("/apis/apps/v1/deployments") == "deployments"
    assert _resource("/apis/wgpolicyk8s.io/v1alpha2/namespaces/team/policyreports/hami-mt-webhook") == "policyreports"
    assert _resource("/apis/coordination.k8s.io/v1/namespaces/ns/leases/hami-mt-webhook-audit") == "leases"
    assert _resource("/apis/wgpolicyk8s.io/v1alpha2/clusterpolicyreports") == "clusterpolicyreports"


def test_an_event_names_the_workload_and_says_deny_or_would_deny() -> None:
    event = _event(finding("train", outcome=WARN), "replica-0")
    assert event["involvedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team",
                                       "name": "train", "uid": "uid-train"}
    assert (event["type"], event["reason"]) == ("Warning", "PodsWouldBeDenied")
    assert event["message"] == "hami-mt-webhook audit: too many cores"
    assert event["metadata"] == {"generateName": "train.", "namespace": "team"}
    assert _event(finding("train"), "replica-0")["reason"] == "PodsDenied"
    assert len(_event(finding("x", "m" * 5000), "r")["message"]) < 1100  # clipped, and says how long it was


def test_a_fixed_violation_leaves_the_metrics_and_so_does_a_replica_that_stops_auditing() -> None:
    metrics = Metrics()
    metrics.audit_done({("range", "team"): 2, ("slice-pods", "old"): 1}, 3.5)
    text = metrics.render().decode()
    assert 'hami_mt_webhook_audit_violations{namespace="team",rule="range"} 2.0' in text
    metrics.audit_done({("range", "team"): 1}, 2.0)
    text = metrics.render().decode()
    assert 'rule="slice-pods"' not in text and "hami_mt_webhook_audit_duration_seconds 2.0" in text
    metrics.audit_lost()
    assert "hami_mt_webhook_audit_violations{" not in metrics.render().decode()


def test_full_collections_are_rarer_during_a_pass_and_the_thresholds_come_back_after_it() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), _rare_full_collections():
        assert gc.get_threshold() == (*before[:2], before[2] * FULL_COLLECTIONS_RARER)  # the young ones as they were
        raise RuntimeError("a pass that fails")
    assert gc.get_threshold() == before
