"""The webhook as kube-apiserver calls it: every rule of SPEC.md §3–§4 through the built kubectl."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import gpus
from devtools.clusters.helm_release import apply_nodes
from devtools.waiting import until

from .support import (
    CORE,
    MEMORY,
    ON_S4000,
    ON_S5000,
    RETIRED,
    TAINT,
    VGPU,
    WHOLE,
    apply,
    exists,
    metric,
    namespace,
    pod,
    resources,
    stored,
    until_seen,
)

ns = namespace("e2e-rules")


def test_slice_pod_is_stored_with_hami_scheduler_and_equal_requests(controlplane, ns):
    r = apply(controlplane, ns, pod("slice", {VGPU: 1, MEMORY: 32, CORE: 8}))
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr  # the scheduler rewrite alone prints nothing
    obj = stored(controlplane, ns, "slice")
    assert obj["spec"]["schedulerName"] == "hami-scheduler"
    limits, requests = resources(obj)
    assert limits == requests == {VGPU: "1", MEMORY: "32", CORE: "8"}


@pytest.mark.parametrize(("name", "selector", "memory"),
                         [("excl-s5000", ON_S5000, "160"), ("excl-s4000", ON_S4000, "96")])
def test_exclusive_fill_takes_the_reported_capacity(controlplane, ns, name, selector, memory):
    r = apply(controlplane, ns, pod(name, {VGPU: 1}, nodeSelector=selector))
    assert r.returncode == 0, r.stderr
    assert f"mthreads.com/sgpu-memory {memory}" in r.stderr  # kubectl prints the admission warning
    limits, requests = resources(stored(controlplane, ns, name))
    assert limits == requests == {VGPU: "1", MEMORY: memory, CORE: "16"}


def test_snapping_stores_requests_equal_to_limits(controlplane, ns):
    # HAMi upstream patched only limits here and the API server answered 422.
    r = apply(controlplane, ns, pod("snap", {VGPU: 1, MEMORY: 20, CORE: 4}))
    assert r.returncode == 0, r.stderr
    assert "Warning: container \"c0\": mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32 (16 GiB)" in r.stderr
    limits, requests = resources(stored(controlplane, ns, "snap"))
    assert limits[MEMORY] == requests[MEMORY] == "32"


def test_multi_card_takes_whole_cards(controlplane, ns):
    r = apply(controlplane, ns, pod("multi", {VGPU: 2}, nodeSelector=ON_S5000))
    assert r.returncode == 0, r.stderr
    obj = stored(controlplane, ns, "multi")
    limits, requests = resources(obj)
    assert limits == requests == {VGPU: "2", MEMORY: "320", CORE: "32"}
    assert obj["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"


def test_multi_card_takes_the_card_of_nodes_that_slice_enough_cards(controlplane, ns):
    """SPEC §3.5: a container's N cards come from one node, so C is taken over nodes that slice N or more."""
    pool = {"e2e-pool": "card-counts"}
    many = gpus.Model("S4000x8", "MTT-S4000", cards=8, per_card=96, cpu="64", memory="512Gi")
    one = gpus.Model("S5000x1", "MTT-S5000", cards=1, per_card=160, cpu="128", memory="1Ti")
    nodes = [m.node(f"e2e-{m.name.lower()}", {**m.labels(f"e2e-{m.name.lower()}"), **pool}) for m in (many, one)]
    apply_nodes(controlplane, nodes)
    try:
        def fill(name: str, **spec: Any) -> subprocess.CompletedProcess[str]:
            return apply(controlplane, ns, pod(name, {VGPU: 2}, **spec), "--dry-run=server", "-o", "json")

        def both_in_view() -> bool:
            """An exclusive pod of the pool sees both nodes' cards (a view without them falls back to
            --memory-per-card, which a vgpu 2 fill of 192 cannot tell apart)."""
            r = apply(controlplane, ns, pod("view", {VGPU: 1}, nodeSelector=pool), "--dry-run=server")
            return r.returncode == 0 and "cards of 96, 160 units" in r.stderr

        until("the webhook's view of both new nodes, with their capacity", both_in_view, timeout=20)
        r = fill("cards", nodeSelector=pool)
        assert r.returncode == 0, r.stderr
        limits, requests = resources(json.loads(r.stdout))
        assert limits == requests == {VGPU: "2", MEMORY: "192", CORE: "32"}
        assert "mthreads.com/sgpu-memory 192 (96 GiB)" in r.stderr and "could come from" not in r.stderr
        r = fill("cards-s5000", nodeSelector={**pool, **ON_S5000})
        assert r.returncode != 0
        assert "mthreads.com/vgpu 2 is more than any node it could run on has: the largest has 1 sliced card" \
            in r.stderr
    finally:
        controlplane.kubectl("delete", "node", *(n["metadata"]["name"] for n in nodes))


def test_mixed_container_is_denied_with_the_message(controlplane, ns):
    r = apply(controlplane, ns, pod("mixed", {WHOLE: 1, VGPU: 1}))
    assert r.returncode != 0
    assert 'admission webhook "mutate.hami-mt.mthreads.com" denied the request: container "c0" asks for ' \
           "mthreads.com/gpu (whole cards, outside HAMi) and for mthreads.com/vgpu (sGPU slices)" in r.stderr
    assert not exists(controlplane, ns, "mixed")


def test_vendor_form_is_converted(controlplane, ns):
    r = apply(controlplane, ns, pod("vendor", {MEMORY: 2, CORE: 1}))
    assert r.returncode == 0, r.stderr
    assert "mthreads.com/vgpu 1 added" in r.stderr
    limits, requests = resources(stored(controlplane, ns, "vendor"))
    assert limits == requests == {VGPU: "1", MEMORY: "2", CORE: "1"}


def test_pods_without_slices_are_untouched_and_never_sent(controlplane, ns, webhook):
    reviews = metric(webhook, "hami_mt_webhook_reviews_total")
    for name, limits in (("plain", {"cpu": "100m"}), ("whole", {WHOLE: 1})):
        r = apply(controlplane, ns, pod(name, limits))
        assert r.returncode == 0, r.stderr
        obj = stored(controlplane, ns, name)
        assert obj["spec"]["schedulerName"] == "default-scheduler"
    # Neither names a slice resource, so neither is sent: a mixing container names a slice and is sent.
    assert metric(webhook, "hami_mt_webhook_reviews_total") == reviews


def test_dry_run_shows_warnings_and_denials_and_stores_nothing(controlplane, ns):
    r = apply(controlplane, ns, pod("dry", {VGPU: 1, MEMORY: 20, CORE: 4}), "--dry-run=server", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert "snapped up to 32" in r.stderr
    assert '"mthreads.com/sgpu-memory": "32"' in r.stdout
    assert not exists(controlplane, ns, "dry")
    r = apply(controlplane, ns, pod("dry-mixed", {WHOLE: 1, MEMORY: 4}), "--dry-run=server")
    assert r.returncode != 0 and "denied the request" in r.stderr
    assert not exists(controlplane, ns, "dry-mixed")


def test_pod_rules_deny_privileged_slice_pods(controlplane, ns):
    bad = pod("priv", {VGPU: 1, MEMORY: 8, CORE: 2})
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    r = apply(controlplane, ns, bad)
    assert r.returncode != 0 and 'container "c0" is privileged' in r.stderr


def test_privileged_ephemeral_container_is_denied_on_a_slice_pod(controlplane, ns):
    """`kubectl debug --profile=sysadmin` writes pods/ephemeralcontainers: only new privileged ones are denied."""
    assert apply(controlplane, ns, pod("debugged", {VGPU: 1, MEMORY: 8, CORE: 2})).returncode == 0
    assert apply(controlplane, ns, pod("debugged-plain", {"cpu": "10m"})).returncode == 0

    def debug(name: str, container: str, profile: str):
        return controlplane.kubectl("debug", "-n", ns, name, "--image=busybox", f"--container={container}",
                                    f"--profile={profile}", check=False)

    r = debug("debugged", "root", "sysadmin")
    assert r.returncode != 0
    assert 'admission webhook "validate.hami-mt.mthreads.com" denied the request: ephemeral container "root" ' \
           "is privileged, and a privileged container sees every card, so it cannot join a pod with sGPU " \
           "slices" in r.stderr
    r = debug("debugged", "look", "general")
    assert r.returncode == 0, r.stderr
    names = [c["name"] for c in stored(controlplane, ns, "debugged")["spec"]["ephemeralContainers"]]
    assert names == ["look"]
    # The pod already has an ephemeral container: only the new one is judged, and a plain pod is not sent.
    r = debug("debugged", "look-again", "general")
    assert r.returncode == 0, r.stderr
    r = debug("debugged-plain", "root", "sysadmin")
    assert r.returncode == 0, r.stderr


def test_reapplying_a_snapped_pod_needs_the_tier_in_the_manifest(controlplane, ns):
    """The snap warning's advice, on the real API server: pod resources are immutable, so a second apply of a
    manifest saying 20 fails; a manifest saying the tier re-applies cleanly, and so does a Deployment."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    first = controlplane.kubectl("apply", "-n", ns, "-f", str(examples / "snap-pod.yaml"), check=False)
    assert first.returncode == 0, first.stderr
    assert "write 32 in the manifest: a pod's resources cannot change" in first.stderr
    again = controlplane.kubectl("apply", "-n", ns, "-f", str(examples / "snap-pod.yaml"), check=False)
    assert again.returncode != 0 and "Forbidden" in again.stderr
    fixed = yaml.safe_load((examples / "snap-pod.yaml").read_text())
    for part in ("limits", "requests"):
        if MEMORY in fixed["spec"]["containers"][0]["resources"].get(part, {}):
            fixed["spec"]["containers"][0]["resources"][part][MEMORY] = 32
    # Bound by the scheduler, the pod would wait for a kubelet to confirm its end: there is none here.
    controlplane.kubectl("delete", "pod", "-n", ns, fixed["metadata"]["name"], "--grace-period=0", "--force")
    for _ in range(2):
        r = apply(controlplane, ns, fixed)
        assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr
    for _ in range(2):
        r = controlplane.kubectl("apply", "-n", ns, "-f", str(examples / "snap-deployment.yaml"), check=False)
        assert r.returncode == 0, r.stderr


def test_a_pod_naming_a_retired_scheduler_goes_to_hami_scheduler_with_a_warning(controlplane, ns):
    """SPEC 4.2: once the vendor scheduler is off, a manifest naming it would stay Pending for ever."""
    r = apply(controlplane, ns, pod("retired", {VGPU: 1, MEMORY: 32, CORE: 8}, schedulerName=RETIRED))
    assert r.returncode == 0, r.stderr
    assert f"Warning: pod names scheduler '{RETIRED}', which is retired (--retired-schedulers): set " \
           "hami-scheduler" in r.stderr
    obj = stored(controlplane, ns, "retired")
    assert obj["spec"]["schedulerName"] == "hami-scheduler"
    # 4.7: the stored pod, applied again, is the webhook's own output: no change, no warning.
    again = controlplane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(unversioned(obj)), check=False)
    assert again.returncode == 0 and "Warning" not in again.stderr, again.stderr
    # Another scheduler is still left alone.
    r = apply(controlplane, ns, pod("volcano", {VGPU: 1, MEMORY: 32, CORE: 8}, schedulerName="volcano"))
    assert r.returncode == 0 and "leaves it unchanged" in r.stderr
    assert stored(controlplane, ns, "volcano")["spec"]["schedulerName"] == "volcano"


def _log_lines(webhook, text: str) -> list[str]:
    return [line for line in webhook.log.read_text(errors="replace").splitlines() if text in line]


def test_an_overcommitted_node_is_used_as_reported_logged_once_and_counted(controlplane, ns, webhook):
    """SPEC §2: 8 cards at overcommit_ratio 1.1 report 1408 units: C = 176, no card's size."""
    name = "e2e-overcommit-node"
    node = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": {"mthreads.com/gpu": "8", CORE: "128", MEMORY: "1408"}}}
    before = metric(webhook, "hami_mt_webhook_nonstandard_capacity_nodes")
    apply_nodes(controlplane, [node])
    try:
        def fill(step: str) -> subprocess.CompletedProcess[str]:
            manifest = pod(f"oc-{step}", {VGPU: 1}, nodeSelector={"kubernetes.io/hostname": name, "e2e-step": step})
            return apply(controlplane, ns, manifest, "--dry-run=server", "-o", "json")

        for step in range(1, 6):  # label changes: node events that keep the capacity
            controlplane.kubectl("label", "node", name, f"e2e-step={step}", "--overwrite")
        def as_reported(r: subprocess.CompletedProcess[str]) -> bool:
            return json.loads(r.stdout)["spec"]["containers"][0]["resources"]["limits"][MEMORY] == "176"

        # The last label reached the view: so did all before it.
        r = until_seen("the last label in the webhook's node view", lambda: fill("5"), as_reported, 20, 0.2,
                       show=lambda r: r.stderr)
        assert "mthreads.com/sgpu-memory 176 (88 GiB); 176 units a card is not a known card size (96, 160): the " \
               "node's reported mthreads.com/sgpu-memory likely includes the vendor's overcommit_ratio" in r.stderr
        assert metric(webhook, "hami_mt_webhook_nonstandard_capacity_nodes") == before + 1
        assert len(_log_lines(webhook, f"node {name}: 176 units")) == 1  # six events, one line
    finally:
        controlplane.kubectl("delete", "node", name)
    until_seen("the deleted node no longer counted",
               lambda: metric(webhook, "hami_mt_webhook_nonstandard_capacity_nodes"), lambda n: n == before, 20, 0.2)


def test_the_opt_in_sliced_node_taint_is_tolerated_by_slice_pods_only(controlplane, ns):
    """--sliced-node-taint: sliced nodes tainted so whole-card pods stay off them; slice pods tolerate it."""
    key, _, rest = TAINT.partition("=")
    value, _, effect = rest.partition(":")
    toleration = {"key": key, "operator": "Equal", "value": value, "effect": effect}
    r = apply(controlplane, ns, pod("tolerating", {VGPU: 1, MEMORY: 8, CORE: 2}))
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr  # like the scheduler rewrite: silent
    obj = stored(controlplane, ns, "tolerating")
    assert toleration in obj["spec"]["tolerations"]
    assert sum(t.get("key") == key for t in obj["spec"]["tolerations"]) == 1
    again = controlplane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(unversioned(obj)), check=False)
    assert again.returncode == 0, again.stderr
    assert stored(controlplane, ns, "tolerating")["spec"]["tolerations"] == obj["spec"]["tolerations"]
    assert apply(controlplane, ns, pod("whole-untolerated", {WHOLE: 1})).returncode == 0
    tolerations = stored(controlplane, ns, "whole-untolerated")["spec"].get("tolerations") or []
    assert all(t.get("key") != key for t in tolerations)  # never sent to the webhook: keeps off sliced nodes


def unversioned(obj: dict) -> dict:
    """The stored object without its resourceVersion: kube-scheduler may bind the pod between the read and the
    apply, and the point here is what the webhook does with its own output, not optimistic concurrency."""
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}
