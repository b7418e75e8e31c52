"""The shipped alerts and dashboard against the real metrics: a real Prometheus (Debian's package, on
loopback, its own data dir) scrapes a webhook and kube-apiserver (with the admin client certificate) while
pods are mutated, denied and warned about, and while the webhook is stopped so the API server's calls
fail. Every rule and every panel must evaluate and name only metrics and labels that scrape has, and
HamiMtWebhookCallsFailing must turn non-empty while the webhook is down.

On a control plane of its own: stopping the session's webhook would fail other modules' pods.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from devtools.clusters import monitoring
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import NAMESPACE, apply_nodes, example_nodes
from devtools.clusters.local import LocalWebhook
from devtools.waiting import NotWithin, until

from .mutators import LoopbackWebhook
from .support import IMAGE, MEMORY, ON_S5000, VGPU, WHOLE, apply, metric, pod, wait_for

NS = "monitoring-e2e"
WARN_NS = "monitoring-e2e-warn"
#: Pods with this label get their memory changed by a second mutating webhook after ours: the validating
#: webhook refuses them (reason changed-after-mutation).
SHRINK_LABEL = "e2e-monitoring-shrink"
#: How long the calling-error alert's expression may take to turn non-empty once calls fail: scrapes
#: every second, and increase() needs two samples of the counter after it first appears.
ALERT_WITHIN_S = 45.0


@dataclass
class Run:
    prometheus: monitoring.Prometheus
    since: float
    rules: dict[str, Any]
    #: What the calling-error alert's expression returned before and while the webhook was stopped.
    calls_failing_before: list[dict[str, Any]] = field(default_factory=list)
    calls_failing_while_down: list[dict[str, Any]] = field(default_factory=list)
    fail_open_while_down: list[dict[str, Any]] = field(default_factory=list)
    replica_down_while_down: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds from the webhook's stop to the calling-error alert's expression turning non-empty.
    calls_failing_after_s: float = -1.0


def deployment(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": IMAGE,
                                                           "resources": {"limits": {VGPU: "1"}}}]}}}}


def shrink(path: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Another team's mutator after ours, reinvoked after ours is: every time, the first container's memory
    set to 20 (no tier). Ours snaps it on reinvocation, this sets it again, and the validating webhook
    finds the pod changed after the mutation."""
    if obj["spec"].get("schedulerName") != "hami-scheduler":
        return []
    return [{"op": "add", "path": f"/spec/containers/0/resources/{part}/mthreads.com~1sgpu-memory", "value": "20"}
            for part in ("limits", "requests")]


def expr_of(rules: dict[str, Any], alert: str) -> str:
    (found,) = [a["expr"] for a in monitoring.alerts(rules) if a["alert"] == alert]
    return found


def bad_request(hook: LocalWebhook) -> None:
    """A body that is no AdmissionReview, as a scanner would send: HTTP 400, counted."""
    ctx = ssl.create_default_context(cafile=str(hook.certs.bundle))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    request = urllib.request.Request(f"{hook.url}/mutate-pods", data=b'{"hello": "world"}',
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=5)
    assert refused.value.code == 400


def idle_connection(hook: LocalWebhook) -> None:
    """A connection that never starts its TLS handshake: closed at the handshake deadline (1 s here)."""
    with socket.create_connection(("127.0.0.1", hook.port), timeout=5) as sock:
        assert sock.recv(1) == b""  # closed by the listener, not by us


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("monitoring")
    rules = monitoring.component_rules()
    (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    after_ours = LoopbackWebhook(workdir / "after-ours", shrink)
    with ControlPlane(workdir=workdir / "cp") as cp:
        # it audits too (every 10 s, with the base's RBAC), so the audit's series are in the scrape
        hook = LocalWebhook(cp, workdir / "webhook", extra_args=[
            "--reload-interval", "1", "--handshake-timeout", "1", "--audit-interval", "10",
            "--pod-name", "monitoring-0", "--pod-namespace", NAMESPACE])
        prom = monitoring.Prometheus(
            workdir / "prometheus", monitoring.scrape_configs(f"127.0.0.1:{hook.metrics_port}", cp.server, cp.workdir),
            [workdir / "rules.yaml"], interval="1s")
        try:
            hook.install()
            apply_nodes(cp, example_nodes())
            hook.start()
            cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(after_ours.configuration(
                "zz-after-ours", "/", {"matchExpressions": [{"key": SHRINK_LABEL, "operator": "Exists"}]})))
            prom.start()
            yield traffic(cp, hook, prom, rules)
        finally:
            prom.stop()
            hook.stop()
            after_ours.close()


def traffic(cp: ControlPlane, hook: LocalWebhook, prom: monitoring.Prometheus, rules: dict[str, Any]) -> Run:
    done = Run(prom, time.time() - 5, rules)
    cp.kubectl("create", "namespace", NS)
    cp.kubectl("create", "namespace", WARN_NS)
    cp.kubectl("label", "namespace", WARN_NS, "hami.io/enforcement=warn")
    # a mutation, a denial, a would-deny
    assert apply(cp, NS, pod("sliced", {VGPU: 1})).returncode == 0
    denied = apply(cp, NS, pod("mixed", {WHOLE: 1, VGPU: 1}))
    assert denied.returncode != 0 and "denied the request" in denied.stderr
    wait_for("the warn registrations to take the labelled namespace",
             lambda: "would deny" in apply(cp, WARN_NS, pod("mixed-warn", {WHOLE: 1, VGPU: 1}),
                                           "--dry-run=server").stderr)
    warned = apply(cp, WARN_NS, pod("mixed-warn", {WHOLE: 1, VGPU: 1}))
    assert warned.returncode == 0 and "would deny" in warned.stderr
    # a pod changed after ours by another mutating webhook
    shrunk = pod("shrunk", {VGPU: 1, MEMORY: 64}, labels={SHRINK_LABEL: "1"}, nodeSelector=ON_S5000)
    wait_for("the second mutating webhook to be called",
             lambda: "changed after hami-mt-webhook admitted it" in apply(cp, NS, shrunk, "--dry-run=server").stderr)
    refused = apply(cp, NS, shrunk)
    assert refused.returncode != 0 and "changed after hami-mt-webhook admitted it" in refused.stderr
    # a body that is no review, a connection past its deadline, certificate files that do not load
    bad_request(hook)
    idle_connection(hook)
    crt = hook.certs.tls_cert.read_bytes()
    hook.certs.tls_cert.write_bytes(b"not a certificate\n")
    try:
        wait_for("a failed certificate reload", lambda: metric(hook, "hami_mt_webhook_certificate_reloads_total",
                                                                result="failed") > 0)
    finally:
        hook.certs.tls_cert.write_bytes(crt)
    wait_for("Prometheus to scrape the would-deny", lambda: prom.query("hami_mt_webhook_would_deny_total"), 30)
    # the warned pod exists: the audit's next pass finds it (a would-deny, in its warn namespace)
    wait_for("Prometheus to scrape the audit's finding",
             lambda: prom.query(f'hami_mt_webhook_audit_violations{{namespace="{WARN_NS}",rule="mixing"}}'), 40)
    done.calls_failing_before = prom.query(expr_of(rules, "HamiMtWebhookCallsFailing"))
    # the webhook stopped: the pod webhooks' calls fail (refused), the workload check's fail open
    hook.stop()
    stopped = time.monotonic()
    calls = itertools.count()

    def alerts_firing() -> bool:
        """One more call refused and one let through; then whether all three alerts' expressions are non-empty."""
        i = next(calls)
        refused = apply(cp, NS, pod(f"while-down-{i}", {VGPU: 1}))
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
        assert apply(cp, NS, deployment(f"while-down-{i}")).returncode == 0
        done.calls_failing_while_down = prom.query(expr_of(rules, "HamiMtWebhookCallsFailing"))
        if done.calls_failing_while_down and done.calls_failing_after_s < 0:
            done.calls_failing_after_s = time.monotonic() - stopped
        done.fail_open_while_down = prom.query(expr_of(rules, "HamiMtWebhookFailingOpen"))
        done.replica_down_while_down = prom.query(expr_of(rules, "HamiMtWebhookReplicaDown"))
        return bool(done.calls_failing_while_down and done.fail_open_while_down and done.replica_down_while_down)

    try:
        with contextlib.suppress(NotWithin):  # what fired by then is the tests' to judge, each alert on its own
            until("the outage's three alerts firing", alerts_firing, ALERT_WITHIN_S, 0.5)
    finally:
        hook.start()
    wait_for("Prometheus to scrape the restarted webhook",
             lambda: any(t["health"] == "up" and t["labels"]["job"] == monitoring.JOB for t in prom.targets())
             and prom.query('up{job="hami-mt-webhook"} == 1'), 30)
    wait_for("every rule to be evaluated", lambda: all(r["health"] != "unknown" for r in prom.rules()), 30)
    return done


def names_only_what_the_scrape_has(prom: monitoring.Prometheus, expr: str, since: float) -> None:
    """Every metric `expr` selects has series since `since`, with every label its matchers and grouping name."""
    found, grouping = monitoring.selectors(expr)
    every: set[str] = set()
    for selector in found:
        names = prom.label_names(selector.metric, since)
        assert names, f"no series of {selector.metric} in the scrape ({expr})"
        missing = selector.labels - names
        assert not missing, f"{selector.metric} has no label {sorted(missing)} in the scrape ({expr})"
        for label, op, value in selector.matchers:  # a value that matches nothing never fires either
            if op in ("=", "=~"):
                assert prom.label_names(selector.matching(label, op, value), since), \
                    f"no series of {selector.metric} has {label}{op}{value} in the scrape ({expr})"
        every |= names
    assert grouping <= every, f"grouping by {sorted(grouping - every)}, which no selected series has ({expr})"


def test_prometheus_scrapes_the_webhook_and_the_api_server(run: Run) -> None:
    health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in run.prometheus.targets()}
    assert health == {monitoring.JOB: ("up", ""), "apiserver": ("up", "")}


def test_every_rule_is_loaded_and_evaluates_without_error(run: Run) -> None:
    loaded = {r["name"]: r for r in run.prometheus.rules()}
    assert set(loaded) == {a["alert"] for a in monitoring.alerts(run.rules)}
    for name, rule in loaded.items():
        assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule.get("lastError"))


#: Alerts on series a replica exports only once it probes other replicas: the webhook scraped here runs alone.
#: The fault tier reads that series from real replicas (tests/faults: the others' failure ratio of a lossy one).
WITH_PEERS_ONLY = {"HamiMtWebhookPeerLinkLossy"}


@pytest.mark.parametrize("alert", [a["alert"] for a in monitoring.alerts(monitoring.component_rules())])
def test_every_rule_names_only_metrics_and_labels_the_scrape_has(run: Run, alert: str) -> None:
    expr = expr_of(run.rules, alert)
    run.prometheus.query(expr)  # evaluates; an error raises with Prometheus's message
    if alert not in WITH_PEERS_ONLY:
        names_only_what_the_scrape_has(run.prometheus, expr, run.since)


@pytest.mark.parametrize(("title", "expr"), monitoring.dashboard_queries(monitoring.dashboard()))
def test_every_dashboard_query_evaluates_and_names_only_what_the_scrape_has(run: Run, title: str, expr: str) -> None:
    run.prometheus.query(expr)
    names_only_what_the_scrape_has(run.prometheus, expr, run.since)


def test_a_renamed_metric_or_label_fails_the_check(run: Run) -> None:
    """The check above can fail: the same expressions, one name changed, do."""
    expr = expr_of(run.rules, "HamiMtWebhookCallsFailing")
    for broken in (expr.replace("rejection_count", "rejections_count"), expr.replace("error_type=", "errortype="),
                   expr.replace("by (name)", "by (webhook_name)"),
                   expr.replace("calling_webhook_error", "calling_error"),
                   expr.replace("hami-mt[.]mthreads", "hami[.]mthreads")):
        with pytest.raises(AssertionError):
            names_only_what_the_scrape_has(run.prometheus, broken, run.since)


def test_the_calling_error_alert_fires_while_the_webhook_is_stopped_and_not_before(run: Run) -> None:
    assert run.calls_failing_before == []
    assert 0 < run.calls_failing_after_s < ALERT_WITHIN_S
    assert {s["metric"]["name"] for s in run.calls_failing_while_down} >= {"mutate.hami-mt.mthreads.com"}
    assert {s["metric"]["name"] for s in run.fail_open_while_down} == {"validate-workloads.hami-mt.mthreads.com"}
    assert [(s["metric"]["job"], s["metric"]["namespace"]) for s in run.replica_down_while_down] == [
        (monitoring.JOB, monitoring.NAMESPACE)]
