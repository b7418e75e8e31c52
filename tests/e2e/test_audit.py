"""The audit on a real API server: what admission never saw, published as PolicyReports under Kyverno's own
CRDs (the API server validates every write against their schema), Events and metrics.

A replica of its own (`serve --audit-interval 10`, logged in as the kustomize base's ServiceAccount, so with its
RBAC) audits beside the session's webhook, which serves admission as usual. A pod admission never saw is made
the way the webhooks leave one alone: in a namespace labelled `hami.io/webhook: ignore` (as kube-system or the
webhook's own), whose label is then removed, so the pod is on default-scheduler in an enforced namespace, as a
pod created before the install is.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import policyreports
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import NAMESPACE
from devtools.clusters.local import LocalWebhook
from devtools.waiting import until
from hami_mt_webhook.cli import main as cli

from .support import CORE, MEMORY, VGPU, apply, metric, pod

CHART_CRDS = Path(__file__).resolve().parents[2] / "charts" / "hami-mt-webhook" / "files" / "crds"
OLD_NS, WARN_NS = "e2e-audit-old", "e2e-audit-warn"
INTERVAL = 10
SLICE = {VGPU: 1, MEMORY: 32, CORE: 8}



def served(controlplane: Any, resource: str) -> bool:
    return controlplane.kubectl("get", resource, "-A", check=False).returncode == 0

@pytest.fixture(scope="module")
def auditor(controlplane: ControlPlane, webhook: LocalWebhook, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalWebhook]:
    """Kyverno's PolicyReport CRDs installed, then a replica that audits every 10 s."""
    for crd in policyreports.crds():
        controlplane.kubectl("apply", "--server-side", "-f", str(crd))
    for name in ("policyreports", "clusterpolicyreports"):
        controlplane.kubectl("wait", "--for=condition=Established", f"crd/{name}.wgpolicyk8s.io", "--timeout=60s")
        until(f"{name} served", partial(served, controlplane, name), 60)
    hook = replica(controlplane, tmp_path_factory.mktemp("auditor"), "e2e-auditor-0")
    try:
        yield hook
    finally:
        hook.stop()


def replica(cp: ControlPlane, workdir: Path, name: str) -> LocalWebhook:
    """A started replica that audits every INTERVAL seconds as `name`, with the base's RBAC."""
    hook = LocalWebhook(cp, workdir, extra_args=["--audit-interval", str(INTERVAL), "--pod-name", name,
                                                 "--pod-namespace", NAMESPACE])
    hook.login()
    hook.start()
    return hook


def report(cp: ControlPlane, ns: str) -> dict[str, Any] | None:
    out = cp.kubectl("get", "policyreport", "hami-mt-webhook", "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def results_for(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    found = report(cp, ns) or {}
    return [r for r in found.get("results") or [] if r["resources"][0]["name"] == name]


def test_the_charts_crds_are_kyvernos() -> None:
    """What `audit.policyReports.installCRDs` installs is Kyverno's release, byte for byte."""
    for upstream in policyreports.crds():
        assert (CHART_CRDS / upstream.name).read_bytes() == upstream.read_bytes(), upstream.name


def test_a_pod_admission_never_saw_fails_in_its_report_until_recreated_through_the_webhook(
        controlplane: ControlPlane, auditor: LocalWebhook, capsys: pytest.CaptureFixture[str]) -> None:
    cp = controlplane
    cp.kubectl("create", "namespace", OLD_NS)
    cp.kubectl("label", "namespace", OLD_NS, "hami.io/webhook=ignore")
    manifest = pod("before-install", SLICE)
    apply(cp, OLD_NS, manifest)
    stored = json.loads(cp.kubectl("get", "pod", "before-install", "-n", OLD_NS, "-o", "json").stdout)
    assert stored["spec"]["schedulerName"] == "default-scheduler"  # no webhook saw it
    cp.kubectl("label", "namespace", OLD_NS, "hami.io/webhook-")
    labelled = time.monotonic()
    [found] = until("the pod in its namespace's PolicyReport", lambda: results_for(cp, OLD_NS, "before-install"),
                    timeout=3 * INTERVAL)
    appeared = time.monotonic() - labelled
    assert (found["policy"], found["rule"], found["result"]) == ("hami-mt-webhook", "slice-pods", "fail")
    assert "on default-scheduler, outside HAMi's accounting" in found["message"]
    assert f"kubectl -n {OLD_NS} delete pod before-install" in found["message"]
    assert found["resources"][0]["uid"] == stored["metadata"]["uid"]
    assert appeared <= 1.5 * INTERVAL, appeared  # within one interval (and the pass's own time)
    assert metric(auditor, "hami_mt_webhook_audit_violations", rule="slice-pods", namespace=OLD_NS) == 1
    assert metric(auditor, "hami_mt_webhook_audit_leader") == 1
    # doctor says the same, read off the report (one judgement: the audit's)
    capsys.readouterr()
    assert cli.main(["doctor", "--kubeconfig", str(cp.kubeconfig), "-o", "json"]) in (0, 1)
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"check": "slice-pods", "severity": "action", "object": f"Pod {OLD_NS}/before-install",
            "message": found["message"]} in said

    # recreated through the webhook: mutated onto hami-scheduler, and the finding is gone with the old pod
    # no kubelet here: a pod the default scheduler bound is removed at once, not after its grace period
    cp.kubectl("delete", "pod", "before-install", "-n", OLD_NS, "--grace-period=0", "--force")
    apply(cp, OLD_NS, manifest)
    again = json.loads(cp.kubectl("get", "pod", "before-install", "-n", OLD_NS, "-o", "json").stdout)
    assert again["spec"]["schedulerName"] == "hami-scheduler"
    until("the report clean, the recreated pod counted as a pass",
          lambda: (r := report(cp, OLD_NS)) and not r.get("results") and r["summary"]["pass"] == 1,
          timeout=3 * INTERVAL)


def test_a_namespace_in_warn_mode_shows_its_would_deny_workloads_and_an_event(
        controlplane: ControlPlane, auditor: LocalWebhook) -> None:
    cp = controlplane
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": WARN_NS, "labels": {"hami.io/enforcement": "warn"}}}))
    template = pod("train", {VGPU: 1, MEMORY: 32, CORE: 17})  # 17 of 16 cores: deny refuses it
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train"},
                  "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "train"}},
                           "template": {"metadata": {"labels": {"app": "train"}}, "spec": template["spec"]}}}
    out = apply(cp, WARN_NS, deployment)
    assert "would deny" in out.stderr  # admitted with the warning: the audit is where it stays visible
    [found] = until("the workload's would-deny in the namespace's report",
                    lambda: results_for(cp, WARN_NS, "train"), timeout=3 * INTERVAL)
    assert (found["rule"], found["result"], found["resources"][0]["kind"]) == ("range", "warn", "Deployment")
    assert "mthreads.com/sgpu-core 17 is not valid" in found["message"]
    summary = (report(cp, WARN_NS) or {})["summary"]
    assert (summary["warn"], summary["fail"]) == (1, 0)

    def event() -> list[dict[str, Any]]:
        items = json.loads(cp.kubectl("get", "events", "-n", WARN_NS, "-o", "json").stdout)["items"]
        return [e for e in items if e["involvedObject"].get("name") == "train"
                and e["reason"] == "PodsWouldBeDenied"]

    [sent] = until("a Warning Event on the Deployment", event, timeout=3 * INTERVAL)
    assert sent["type"] == "Warning" and "sgpu-core 17 is not valid" in sent["message"]
    time.sleep(INTERVAL + 2)  # another pass: the same finding is not sent again within --audit-event-every
    assert len(event()) == 1


def test_one_replica_audits_and_another_takes_over_when_it_dies(
        controlplane: ControlPlane, auditor: LocalWebhook, tmp_path: Path) -> None:
    """Two replicas: only the Lease's holder audits; killed (no clean release of the Lease), the other takes over
    once it has seen the Lease unrenewed for its 15 s, and finishes a pass."""
    other = replica(controlplane, tmp_path, "e2e-auditor-1")
    try:
        time.sleep(6)  # more than a renewal: the other has seen the Lease held
        assert metric(auditor, "hami_mt_webhook_audit_leader") == 1
        assert metric(other, "hami_mt_webhook_audit_leader") == 0
        assert metric(other, "hami_mt_webhook_audit_last_success_timestamp_seconds") == 0
        auditor.stop(signal.SIGKILL)
        killed = time.monotonic()
        until("the other replica auditing",
              lambda: metric(other, "hami_mt_webhook_audit_last_success_timestamp_seconds") > 0, timeout=60)
        took = time.monotonic() - killed
        assert 10 <= took <= 30, took  # not before the Lease could expire; soon after it did
        lease = json.loads(controlplane.kubectl("get", "lease", "hami-mt-webhook-audit", "-n", NAMESPACE,
                                                "-o", "json").stdout)
        assert lease["spec"]["holderIdentity"] == "e2e-auditor-1"
        assert lease["spec"]["leaseTransitions"] >= 1
        # stopped cleanly (SIGTERM: kopf's cleanup), it hands the Lease back: the next replica need not wait
        assert other.stop() == 0
        lease = json.loads(controlplane.kubectl("get", "lease", "hami-mt-webhook-audit", "-n", NAMESPACE,
                                                "-o", "json").stdout)
        assert not lease["spec"].get("holderIdentity"), lease["spec"]
    finally:
        other.stop()
