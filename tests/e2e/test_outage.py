"""What happens without the webhook: other pods (whole-card pods too) still create, slice pods fail closed,
the backstop holds."""

from __future__ import annotations

import json

import pytest

from .support import MEMORY, VGPU, WHOLE, apply, exists, namespace, pod

PODS_DURING_OUTAGE = 100
WHOLE_CARD_PODS = 20
IGNORE = {"hami.io/webhook": "ignore"}


ns = namespace("e2e-outage")


def test_webhook_down_blocks_only_gpu_pods_and_recovers(controlplane, webhook, ns):
    webhook.stop()
    try:
        docs = [pod(f"plain-{i}", {"cpu": "10m"}) for i in range(PODS_DURING_OUTAGE)]
        # Whole cards only: the webhook never changes these, so they are never sent (README's promise).
        docs += [pod(f"whole-{i}", {WHOLE: 1}) for i in range(WHOLE_CARD_PODS)]
        docs.append(pod("whole-requests", {}))
        docs[-1]["spec"]["containers"][0]["resources"] = {"requests": {WHOLE: "1"}, "limits": {WHOLE: "1"}}
        r = controlplane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                                  "items": docs}), check=False)
        assert r.returncode == 0, r.stderr
        created = controlplane.kubectl("get", "pods", "-n", ns, "-o", "name").stdout.split()
        assert len([n for n in created if n.startswith("pod/plain-")]) == PODS_DURING_OUTAGE
        assert len([n for n in created if n.startswith("pod/whole-")]) == WHOLE_CARD_PODS + 1
        r = apply(controlplane, ns, pod("gpu-down", {VGPU: 1}))
        assert r.returncode != 0
        assert 'failed calling webhook "mutate.hami-mt.mthreads.com"' in r.stderr
        assert "connection refused" in r.stderr
        assert not exists(controlplane, ns, "gpu-down")
        # A pod whose own label skips the mutation still meets the validating webhook, which is down too.
        r = apply(controlplane, ns, pod("gpu-labelled-down", {VGPU: 1, MEMORY: 32}, labels=IGNORE,
                                        schedulerName="hami-scheduler"))
        assert r.returncode != 0
        assert 'failed calling webhook "validate.hami-mt.mthreads.com"' in r.stderr
        assert not exists(controlplane, ns, "gpu-labelled-down")
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
    # The pod's own ignore label does not skip the backstop (SPEC 4.8).
    r = apply(controlplane, ns, pod("vap-labelled", {VGPU: 1}, labels=IGNORE))
    assert r.returncode != 0
    assert "hami-mt-backstop" in r.stderr and "label skips the mutation only" in r.stderr
    r = apply(controlplane, ns, pod("vap-labelled-mixed", {WHOLE: 1, MEMORY: 4}, labels=IGNORE,
                                    schedulerName="hami-scheduler"))
    assert r.returncode != 0 and "hami-mt-backstop" in r.stderr and "mixes" in r.stderr
    r = apply(controlplane, ns, pod("vap-whole", {WHOLE: 1}))
    assert r.returncode == 0, r.stderr
    r = apply(controlplane, ns, pod("vap-plain", {"cpu": "10m"}))
    assert r.returncode == 0, r.stderr
