"""What happens without the webhook: other pods still create, GPU pods fail closed, the backstop holds."""

from __future__ import annotations

import json

import pytest

from .support import MEMORY, VGPU, WHOLE, apply, exists, pod

PODS_DURING_OUTAGE = 100


@pytest.fixture(scope="module")
def ns(controlplane, webhook):
    name = "e2e-outage"
    controlplane.kubectl("create", "namespace", name)
    return name


def test_webhook_down_blocks_only_gpu_pods_and_recovers(controlplane, webhook, ns):
    webhook.stop()
    try:
        docs = [pod(f"plain-{i}", {"cpu": "10m"}) for i in range(PODS_DURING_OUTAGE)]
        r = controlplane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                                  "items": docs}), check=False)
        assert r.returncode == 0, r.stderr
        created = controlplane.kubectl("get", "pods", "-n", ns, "-o", "name").stdout.split()
        assert len([n for n in created if n.startswith("pod/plain-")]) == PODS_DURING_OUTAGE
        r = apply(controlplane, ns, pod("gpu-down", {VGPU: 1}))
        assert r.returncode != 0
        assert 'failed calling webhook "mutate.hami-mt.mthreads.com"' in r.stderr
        assert "connection refused" in r.stderr
        assert not exists(controlplane, ns, "gpu-down")
    finally:
        webhook.start()
    r = apply(controlplane, ns, pod("gpu-up", {VGPU: 1}))
    assert r.returncode == 0, r.stderr


@pytest.fixture
def webhooks_skipped(controlplane, webhook):
    """Every replica down and the webhooks set to Ignore: only the ValidatingAdmissionPolicy is left."""
    patch = json.dumps([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}])
    kinds = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
    for kind in kinds:
        controlplane.kubectl("patch", kind, "hami-mt-webhook", "--type=json", "-p", patch)
    webhook.stop()
    try:
        yield
    finally:
        restore = patch.replace("Ignore", "Fail")
        for kind in kinds:
            controlplane.kubectl("patch", kind, "hami-mt-webhook", "--type=json", "-p", restore)
        webhook.start()


def test_backstop_policy_holds_with_every_replica_down(controlplane, ns, webhooks_skipped):
    r = apply(controlplane, ns, pod("vap-mixed", {WHOLE: 1, MEMORY: 4}))
    assert r.returncode != 0
    assert "hami-mt-backstop" in r.stderr and "c0" in r.stderr and "mthreads.com/gpu" in r.stderr
    r = apply(controlplane, ns, pod("vap-unmutated", {VGPU: 1}))
    assert r.returncode != 0
    assert "hami-mt-backstop" in r.stderr and "did not run" in r.stderr
    assert not exists(controlplane, ns, "vap-mixed") and not exists(controlplane, ns, "vap-unmutated")
    r = apply(controlplane, ns, pod("vap-plain", {"cpu": "10m"}))
    assert r.returncode == 0, r.stderr
