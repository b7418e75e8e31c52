"""The chart's certificate chain under cert-manager: the serving certificate signed by the chart's root, the
root in every caBundle, doctor's view of it, and renewals and a root rotation that refuse no slice pod."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from devtools import paths
from devtools.clusters import helm_release
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread
from devtools.scenarios import renewals
from devtools.waiting import seconds_until
from hami_mt_webhook.doctor.serving import signs

from .conftest import MEASURED


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


def test_the_root_signs_the_serving_certificate_and_is_the_ca_bundle(chart: NodeCluster) -> None:
    root = renewals.secret_certificate(chart, renewals.ROOT)
    leaf = renewals.secret_certificate(chart, renewals.SECRET)
    assert signs(root, leaf)
    assert renewals.secret_certificate(chart, renewals.SECRET, "ca.crt") == root
    bundles = renewals.ca_bundles(chart)
    assert len(bundles) >= len(renewals.CONFIGURATIONS) and all(b == [root] for b in bundles.values())
    served = renewals.served_expiries(chart)
    assert len(served) == 3
    assert all(abs(v - leaf.not_valid_after_utc.timestamp()) < 1 for v in served.values())


def test_doctor_reads_cert_managers_view(chart: NodeCluster) -> None:
    done = subprocess.run([str(paths.REPO_ROOT / ".venv" / "bin" / "hami-mt-webhook"), "doctor", "--kubeconfig",
                           str(chart.kubeconfig), "-o", "json"], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    findings = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ours = [f for f in findings if f.get("check") == "cert-manager"]
    assert ours, done.stdout
    assert [f for f in ours if f["severity"] == "action"] == []
    objects = {f["object"] for f in ours}
    assert {f"Certificate {renewals.NAMESPACE}/{renewals.SERVING}",
            f"Certificate {renewals.NAMESPACE}/{renewals.ROOT}"} <= objects
    assert all("next renewal" in f["message"] for f in ours)


def test_three_renewals_and_a_root_rotation_refuse_no_pod(chart: NodeCluster, lt: LoopThread) -> None:
    counted = renewals.count_renewals(chart, lt, renewals=3, root=True)
    MEASURED.append(counted.line())
    MEASURED.extend(counted.steps)
    assert counted.created > 1000
    assert counted.refused == []


def test_a_fresh_install_with_cert_manager_admits_from_its_first_replica(chart: NodeCluster, lt: LoopThread) -> None:
    """The README's install with `certManager.enabled=true` on a cluster without the chart: cainjector fills
    every caBundle from the first render (none is rendered), and slice pods are admitted once the replicas are
    Ready. Last in the tier: it removes the release the renewals ran on."""
    cp = chart.controlplane
    helm_release.helm(cp, "uninstall", helm_release.RELEASE, "-n", renewals.NAMESPACE, "--wait", "--timeout", "120s")
    # cert-manager leaves the Secrets it wrote; a cluster that never had the chart has none
    chart.kubectl("delete", "secret", "-n", renewals.NAMESPACE, renewals.SECRET, renewals.ROOT,
                  "--ignore-not-found")
    started = time.monotonic()
    helm_release.helm(cp, "install", helm_release.RELEASE, str(paths.CHART), "-n", renewals.NAMESPACE,
               "--set", f"image.repository={helm_release.NODE_IMAGE_REPOSITORY}", "--set", "certManager.enabled=true")
    seconds_until("3 replicas Ready", lambda: helm_release.ready_replicas(chart) == 3, 180)
    ready = time.monotonic() - started
    root = renewals.secret_certificate(chart, renewals.ROOT)
    seconds_until("the root alone in every caBundle", lambda: all(
        b == [root] for b in renewals.ca_bundles(chart).values()), 60)
    assert signs(root, renewals.secret_certificate(chart, renewals.SECRET))
    counted = renewals.Counted("fresh install with certManager.enabled=true")
    with renewals.traffic(chart, lt, "fresh-install", counted):
        time.sleep(10)
    MEASURED.append(f"helm install with certManager.enabled=true to 3 replicas Ready: {ready:.1f} s")
    MEASURED.append(counted.line())
    assert counted.refused == []
    assert counted.created >= 200
