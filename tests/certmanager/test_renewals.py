"""The chart's certificate chain under cert-manager: the serving certificate signed by the chart's root, the
root in every caBundle, doctor's view of it, and renewals and a root rotation that refuse no slice pod."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from devtools import renewals
from devtools.nodes import Cluster
from devtools.traffic import LoopThread
from hami_mt_webhook.doctor.serving import signs

from .conftest import MEASURED

ROOT_DIR = renewals.local.CHART.parent.parent


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


def test_the_root_signs_the_serving_certificate_and_is_the_ca_bundle(chart: Cluster) -> None:
    root = renewals.secret_certificate(chart, renewals.ROOT)
    leaf = renewals.secret_certificate(chart, renewals.SECRET)
    assert signs(root, leaf)
    assert renewals.secret_certificate(chart, renewals.SECRET, "ca.crt") == root
    bundles = renewals.ca_bundles(chart)
    assert len(bundles) >= len(renewals.CONFIGURATIONS) and all(b == [root] for b in bundles.values())
    served = renewals.served_expiries(chart)
    assert len(served) == 3
    assert all(abs(v - leaf.not_valid_after_utc.timestamp()) < 1 for v in served.values())


def test_doctor_reads_cert_managers_view(chart: Cluster) -> None:
    done = subprocess.run([str(ROOT_DIR / ".venv" / "bin" / "hami-mt-webhook"), "doctor", "--kubeconfig",
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


def test_three_renewals_and_a_root_rotation_refuse_no_pod(chart: Cluster, lt: LoopThread) -> None:
    counted = renewals.count_renewals(chart, lt, renewals=3, root=True)
    MEASURED.append(counted.line())
    MEASURED.extend(counted.steps)
    assert counted.created > 1000
    assert counted.refused == []
