"""Failover against a real API server: three `serve` processes watch each other through the shipped RBAC.

Each process plays one replica: a Pod object of its own in the webhook's namespace (its readiness gate,
its address a loopback one of its own, its Ready condition as kubelet would write it), the shared probe
port on that address, logged in as the shipped ServiceAccount. There is no kubelet here, so what the
replicas write on the pods' status is all that changes them. The node tier shows the same with real
replicas on real nodes, and what it spares in refused pod creations.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import procs
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import NAMESPACE
from devtools.clusters.local import LocalWebhook
from hami_mt_webhook.service.failover.peerview import CONDITION

from .support import metric, wait_for

LABEL = "hami-mt.example/failover-test"
NAMES = ("replica-a", "replica-b", "replica-c")


def replica_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {LABEL: "yes"}},
            "spec": {"schedulerName": "nobody", "readinessGates": [{"conditionType": CONDITION}],
                     "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "webhook", "image": "hami-mt-webhook", "securityContext": {
                         "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}


def conditions(cp: ControlPlane, name: str) -> dict[str, str]:
    pod = json.loads(cp.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json").stdout)
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}


def condition_message(cp: ControlPlane, name: str) -> str:
    pod = json.loads(cp.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json").stdout)
    return next(c.get("message", "") for c in pod["status"]["conditions"] if c["type"] == CONDITION)


@pytest.fixture(scope="module")
def replicas(controlplane: ControlPlane, webhook: LocalWebhook) -> Iterator[dict[str, LocalWebhook]]:
    """Three replicas, each Ready as kubelet would have it, on 127.0.0.2-4 and one probe port."""
    (port,) = procs.free_ports(1)
    hooks: dict[str, LocalWebhook] = {}
    try:
        for i, name in enumerate(NAMES):
            ip = f"127.0.0.{i + 2}"
            controlplane.kubectl("apply", "-f", "-", input=json.dumps(replica_pod(name)))
            status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                                 "conditions": [{"type": "Ready", "status": "True"}]}}
            controlplane.kubectl("patch", "pod", name, "-n", NAMESPACE, "--subresource=status", "--type=merge",
                                 "-p", json.dumps(status))
            hook = LocalWebhook(controlplane, controlplane.workdir / f"failover-{name}", env={
                "HAMI_MT_POD_NAME": name, "HAMI_MT_POD_NAMESPACE": NAMESPACE},
                extra_args=["--peer-selector", f"{LABEL}=yes"])
            hook.health_host, hook.health_port = ip, port
            hook.login()  # the shipped ServiceAccount, as the session's webhook installed it
            hook.start()
            hooks[name] = hook
        wait_for("every replica vouched for itself",
                 lambda: all(conditions(controlplane, n).get(CONDITION) == "True" for n in NAMES), timeout=30)
        yield hooks
    finally:
        for hook in hooks.values():
            if hook.proc is not None:
                hook.proc.send_signal(signal.SIGCONT)
            hook.stop()
        controlplane.kubectl("delete", "pod", *NAMES, "-n", NAMESPACE, "--wait=false", check=False)


def test_a_stopped_replica_is_taken_out_within_about_a_second_and_put_back_when_it_answers(
        controlplane: ControlPlane, replicas: dict[str, LocalWebhook]) -> None:
    stopped = replicas["replica-c"]
    assert stopped.proc is not None
    stopped.proc.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        wait_for("replica-c marked not answering and not Ready",
                 lambda: conditions(controlplane, "replica-c") == {"Ready": "False", CONDITION: "False"}, timeout=10)
        took = time.monotonic() - started
    finally:
        stopped.proc.send_signal(signal.SIGCONT)
    assert took < 3.0, f"{took:.1f} s from SIGSTOP to the verdict"
    assert "2 of 3 replicas agree" in condition_message(controlplane, "replica-c")
    assert all(conditions(controlplane, n) == {"Ready": "True", CONDITION: "True"} for n in NAMES[:2])
    verdicts = sum(metric(replicas[n], "hami_mt_webhook_peer_verdicts_total", verdict="not_answering")
                   for n in NAMES[:2])
    assert verdicts >= 1
    logged = "".join(replicas[n].tail(200) for n in NAMES[:2])
    assert "replica replica-c marked not answering" in logged
    # Thawed, it answers again: most replicas hear it for a second, and it is put back.
    wait_for("replica-c marked answering again",
             lambda: conditions(controlplane, "replica-c").get(CONDITION) == "True", timeout=10)
    assert "answering for" in condition_message(controlplane, "replica-c")
    # Ready is kubelet's to compute again from the gate (the node tier shows it does); no kubelet here.
    controlplane.kubectl("patch", "pod", "replica-c", "-n", NAMESPACE, "--subresource=status", "--type=strategic",
                         "-p", json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}))


def test_a_replica_that_hears_nobody_marks_nobody(controlplane: ControlPlane,
                                                  replicas: dict[str, LocalWebhook]) -> None:
    """a and b stopped: c hears neither, and with no other replica agreeing it writes no verdict (and
    says so in its metrics); a replica cut off from the others is no judge of them."""
    wait_for("every replica answering", lambda: all(
        conditions(controlplane, n).get(CONDITION) == "True" for n in NAMES), timeout=15)
    frozen = [replicas[n] for n in NAMES[:2]]
    for hook in frozen:
        assert hook.proc is not None
        hook.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for("replica-c sees two disputed peers",
                 lambda: metric(replicas["replica-c"], "hami_mt_webhook_peers", state="disputed") == 2, timeout=10)
        time.sleep(1.5)
        assert all(conditions(controlplane, n) == {"Ready": "True", CONDITION: "True"} for n in NAMES)
        assert metric(replicas["replica-c"], "hami_mt_webhook_peer_verdicts_total", verdict="not_answering") == 0
    finally:
        for hook in frozen:
            assert hook.proc is not None
            hook.proc.send_signal(signal.SIGCONT)
    wait_for("replica-c hears them again",
             lambda: metric(replicas["replica-c"], "hami_mt_webhook_peers", state="answering") == 2, timeout=10)
