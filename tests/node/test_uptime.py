"""No pod creation lost while Kubernetes itself restarts, moves, upgrades, re-keys and removes the webhook.

Each test creates slice pods through the API at 20 a second (the webhooks fail closed, so every one of
them needs a replica) while the chart's Deployment goes through one of the things that happen to it on
a cluster, and counts every creation's outcome: all must be created. The replicas run on the real node
(`conftest.chart`), reached by kube-apiserver through the Service's endpoints; nothing here stops a
process itself: kubectl, helm and kubelet do, with the chart's preStop, probes, PodDisruptionBudget and
rolling-update settings. Runs after the other modules of the tier (it ends with `helm uninstall`).
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from devtools import local
from devtools.nodes import Cluster
from devtools.traffic import LoopThread, PodCreator, creating
from hami_mt_webhook.service import certs
from tests.e2e.support import VGPU, WHOLE, pod

from .conftest import MEASURED, NAMESPACE

RATE = 20  # pods per second
DEPLOYMENT = f"deployment/{local.RELEASE}"
CONFIGS = (("mutatingwebhookconfiguration", "hami-mt-webhook"), ("validatingwebhookconfiguration", "hami-mt-webhook"),
           ("validatingwebhookconfiguration", "hami-mt-webhook-workloads"),
           ("mutatingwebhookconfiguration", "hami-mt-webhook-warn"),
           ("validatingwebhookconfiguration", "hami-mt-webhook-warn"))


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@contextmanager
def load(node: Cluster, lt: LoopThread, what: str, seconds: float) -> Iterator[PodCreator]:
    """Slice pods created at RATE for `seconds` in a namespace of their own; on leaving, every creation
    must have succeeded, and no replica may have restarted or logged a traceback."""
    ns = "load-" + re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")[:40]
    started = time.monotonic()
    with creating(node.controlplane, lt, ns, RATE, seconds) as creator:
        yield creator
    total = int(RATE * seconds)
    MEASURED.append(f"{what}: {creator.results[201]}/{total} pods created, {len(creator.failures)} failed "
                    f"({time.monotonic() - started:.0f} s)")
    assert creator.failures == [], (creator.failures[:5], verdicts(node))
    assert creator.results[201] == total
    assert_replicas_healthy(node)


def verdicts(node: Cluster) -> list[str]:
    """The failover verdicts the replicas logged: what took a replica out of the endpoints, and when."""
    lines = []
    for p in replicas(node, terminating=True):
        logs = node.kubectl("logs", "-n", NAMESPACE, p["metadata"]["name"], check=False).stdout
        lines += [line for line in logs.splitlines() if "marked" in line or "could not mark" in line]
    return lines


def replicas(node: Cluster, *, terminating: bool = False) -> list[dict[str, Any]]:
    """The webhook's pods; those being deleted (still serving through their preStop) only if asked."""
    out = node.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=hami-mt-webhook",
                       "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if terminating or not p["metadata"].get("deletionTimestamp")]


def ready(node: Cluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in replicas(node)
                  if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))


def wait_for(what: str, check: Callable[[], bool], timeout: float = 180.0) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - started


def rolled_out(node: Cluster) -> None:
    """The rollout done and the old replicas gone: until their preStop ends they still answer on the
    API server's kept-alive connections, with the old settings."""
    node.kubectl("rollout", "status", DEPLOYMENT, "-n", NAMESPACE, "--timeout=180s", timeout=200)
    wait_for("3 replicas Ready, no other left",
             lambda: len(ready(node)) == 3 and len(replicas(node, terminating=True)) == 3)


def assert_replicas_healthy(node: Cluster) -> None:
    """No replica restarted by kubelet, and none logged a traceback."""
    for p in replicas(node):
        name = p["metadata"]["name"]
        restarts = sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
        assert restarts == 0, f"{name} restarted {restarts} times"
        logs = node.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout
        assert "Traceback" not in logs, f"{name}:\n{logs[-3000:]}"


def replica_metric(node: Cluster, pod_name: str, metric: str) -> float | None:
    text = node.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name}:9090/proxy/metrics",
                        check=False).stdout
    found = re.search(rf"^{re.escape(metric)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def helm(node: Cluster, *args: str) -> None:
    local.helm(node.controlplane, *args)


def test_rollout_restart_loses_no_pod(chart: Cluster, lt: LoopThread) -> None:
    before = set(ready(chart))
    with load(chart, lt, "kubectl rollout restart", 40):
        time.sleep(3)
        chart.kubectl("rollout", "restart", DEPLOYMENT, "-n", NAMESPACE)
        rolled_out(chart)
    assert not before & set(ready(chart)), "every replica was replaced"


def test_a_deleted_replica_loses_no_pod(chart: Cluster, lt: LoopThread) -> None:
    victim = ready(chart)[0]
    with load(chart, lt, "kubectl delete pod", 30):
        time.sleep(3)
        started = time.monotonic()
        chart.kubectl("delete", "pod", victim, "-n", NAMESPACE, timeout=60)
        MEASURED.append(f"kubectl delete pod (preStop 5 s, then SIGTERM): {time.monotonic() - started:.1f} s")
        rolled_out(chart)
    assert victim not in ready(chart)


def test_a_drain_respects_the_disruption_budget_and_loses_no_pod(chart: Cluster, lt: LoopThread) -> None:
    """One node holds all three replicas: the drain evicts two (the replacements cannot be placed on the
    cordoned node) and the PodDisruptionBudget refuses the third, so one replica always answers."""
    node_name = chart.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=hami-mt-webhook",
                              "-o", "jsonpath={.items[0].spec.nodeName}").stdout
    fewest = 3
    with load(chart, lt, "kubectl drain (PodDisruptionBudget minAvailable 1)", 40):
        time.sleep(3)
        drain = chart.kubectl("drain", node_name, "--ignore-daemonsets", "--delete-emptydir-data",
                              "--timeout=20s", check=False, timeout=60)
        fewest = min(fewest, len(ready(chart)))
        assert drain.returncode != 0 and "disruption budget" in drain.stderr, drain.stderr[-2000:]
        assert len(ready(chart)) >= 1
        chart.kubectl("uncordon", node_name)
        rolled_out(chart)
    MEASURED.append(f"drain: {fewest} replica(s) Ready at its end, the budget refused the last eviction")


def test_helm_upgrade_of_a_value_loses_no_pod_and_takes_effect(chart: Cluster, lt: LoopThread) -> None:
    mixed = pod("mixed", {VGPU: 1, WHOLE: 1})
    with load(chart, lt, "helm upgrade --set enforcement=warn and back", 60):
        time.sleep(3)
        helm(chart, "upgrade", local.RELEASE, str(local.CHART), "-n", NAMESPACE, "--reuse-values",
             "--set", "enforcement=warn")
        rolled_out(chart)
        ns = "upgrade-check"
        chart.kubectl("create", "namespace", ns)
        warned = chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mixed))
        assert "would deny" in warned.stderr, warned.stderr  # warn is in force: created, with the warning
        helm(chart, "upgrade", local.RELEASE, str(local.CHART), "-n", NAMESPACE, "--reuse-values",
             "--set", "enforcement=deny")
        rolled_out(chart)
        mixed["metadata"]["name"] = "mixed-again"
        denied = chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mixed), check=False)
        assert denied.returncode != 0 and "asks for mthreads.com/gpu" in denied.stderr, denied.stderr
        chart.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_rotated_certificate_is_reloaded_without_a_restart_and_loses_no_pod(chart: Cluster, lt: LoopThread) -> None:
    """A renewal to a new CA, done in the order that keeps every call trusted: the webhook configurations
    trust the old and the new CA, the Secret is replaced (kubelet swaps the mounted files through
    `..data`), every replica serves the new certificate without a restart, then only the new CA is
    trusted."""
    ca = certs.new_ca()
    names = certs.service_names(local.RELEASE, NAMESPACE)
    serving = certs.issue(ca, names[2], dns=names)
    secret = json.loads(chart.kubectl("get", "secret", "hami-mt-webhook-tls", "-n", NAMESPACE, "-o", "json").stdout)
    old_ca = base64.b64decode(secret["data"]["ca.crt"])
    names = ready(chart)
    with load(chart, lt, "TLS Secret rotated (kubelet's atomic swap of the mounted files)", 90):
        time.sleep(3)
        set_ca_bundle(chart, old_ca + ca.cert_pem())
        secret["data"] = {"ca.crt": b64(ca.cert_pem()), "tls.crt": b64(serving.cert_pem()),
                          "tls.key": b64(serving.key_pem())}
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            secret["metadata"].pop(key, None)
        chart.kubectl("replace", "-f", "-", input=json.dumps(secret))
        expiry = serving.cert.not_valid_after_utc.timestamp()
        took = wait_for("every replica serving the new certificate", lambda: all(
            replica_metric(chart, n, "hami_mt_webhook_certificate_expiry_timestamp_seconds") == expiry
            for n in names), timeout=150)
        MEASURED.append(f"TLS Secret replaced to every replica serving it: {took:.0f} s (kubelet's sync, then "
                        "the webhook's reload)")
        set_ca_bundle(chart, ca.cert_pem())
    assert ready(chart) == names, "the replicas were restarted"


def test_with_every_replica_gone_slice_pods_are_refused_and_whole_cards_created(chart: Cluster) -> None:
    ns = "outage"
    chart.kubectl("create", "namespace", ns)
    try:
        chart.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=0")
        wait_for("no replica left", lambda: not replicas(chart, terminating=True), timeout=120)
        refused = chart.kubectl("create", "-n", ns, "-f", "-", check=False,
                                input=json.dumps(pod("slice-down", {VGPU: 1})))
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
        assert "mutate.hami-mt.mthreads.com" in refused.stderr, refused.stderr
        chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(pod("whole-down", {WHOLE: 1})))
        chart.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=3")
        took = wait_for("3 replicas Ready again", lambda: len(ready(chart)) == 3)
        MEASURED.append(f"scaled 0 -> 3: slice pods admitted again {took:.1f} s after the scale")
        created = chart.kubectl("create", "-n", ns, "-f", "-", "-o", "json",
                                input=json.dumps(pod("slice-up", {VGPU: 1})))
        assert json.loads(created.stdout)["spec"]["schedulerName"] == "hami-scheduler"
        chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(pod("whole-up", {WHOLE: 1})))
    finally:
        chart.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=3")
        chart.kubectl("delete", "namespace", ns, "--wait=false")
    assert_replicas_healthy(chart)


def test_uninstall_leaves_no_webhook_configuration_or_policy(chart: Cluster) -> None:
    assert_replicas_healthy(chart)
    helm(chart, "uninstall", local.RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
    for kind, name in CONFIGS:
        assert chart.kubectl("get", kind, name, check=False).returncode != 0, (kind, name)
    policies = chart.kubectl("get", "validatingadmissionpolicies,validatingadmissionpolicybindings",
                             "-o", "name").stdout
    assert "hami-mt" not in policies, policies
    # Nothing is left to refuse a slice pod once kube-apiserver's admission has seen the deletions (its
    # policy and webhook caches follow the objects within seconds).
    ns = "after-uninstall"
    chart.kubectl("create", "namespace", ns)
    manifest = json.dumps(pod("slice", {VGPU: 1}))
    took = wait_for("a slice pod admitted with nothing installed", lambda: chart.kubectl(
        "create", "-n", ns, "-f", "-", input=manifest, check=False).returncode == 0, timeout=30)
    MEASURED.append(f"helm uninstall --wait to a slice pod admitted unchanged: {took:.1f} s more")
    created = json.loads(chart.kubectl("get", "pod", "slice", "-n", ns, "-o", "json").stdout)
    assert created["spec"].get("schedulerName") == "default-scheduler"


def set_ca_bundle(node: Cluster, bundle: bytes) -> None:
    encoded = b64(bundle)
    for kind, name in CONFIGS:
        hooks = json.loads(node.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"]
        patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
                 for i in range(len(hooks))]
        node.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
