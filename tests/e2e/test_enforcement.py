"""Rollout mode through kube-apiserver (SPEC 4.10): what `deny` refuses, `warn` admits with the warning
`would deny: <the same message>`, still mutating the pod as far as the rules can; the backstop policy warns
instead of denying. Per namespace by the `hami.io/enforcement: warn` label under the session's `deny`
webhook, and cluster-wide with a webhook started with `--enforcement warn`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.local import LocalWebhook

from .support import CORE, IMAGE, MEMORY, ON_S5000, VGPU, WHOLE, apply, exists, metric, pod, resources, stored, wait_for

WARN_NS, DENY_NS = "e2e-enforcement-warn", "e2e-enforcement-deny"
DENIED = 'admission webhook "mutate.hami-mt.mthreads.com" denied the request: '
WOULD_DENY = "Warning: would deny: "


@pytest.fixture(scope="module")
def namespaces(controlplane: ControlPlane, webhook: LocalWebhook) -> tuple[str, str]:
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WARN_NS,
                                                                   "labels": {"hami.io/enforcement": "warn"}}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DENY_NS}}]
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return WARN_NS, DENY_NS


def half_bad(name: str) -> dict[str, Any]:
    """A pod whose first container asks for sgpu-core without sgpu-memory and whose second is snapped."""
    return pod(name, {VGPU: 1, CORE: 4}, {VGPU: 1, MEMORY: 20}, nodeSelector=ON_S5000)


def ignored(name: str) -> dict[str, Any]:
    """A slice pod whose own label skips the mutation, left on the default scheduler: the validating webhook
    and the backstop deny it under deny."""
    return pod(name, {VGPU: 1, MEMORY: 32, CORE: 4}, labels={"hami.io/webhook": "ignore"})


def denial(r: Any) -> str:
    """The message of a denial by the mutating webhook, as kubectl prints it."""
    assert r.returncode != 0 and DENIED in r.stderr, r.stderr
    return r.stderr.split(DENIED, 1)[1].strip()


def test_a_namespace_labelled_warn_admits_with_the_denials_message_and_mutates(controlplane, webhook, namespaces):
    message = denial(apply(controlplane, DENY_NS, half_bad("half-bad")))
    assert message.startswith('container "c0": mthreads.com/sgpu-core 4 without mthreads.com/sgpu-memory')
    assert not exists(controlplane, DENY_NS, "half-bad")
    before = metric(webhook, "hami_mt_webhook_would_deny_total", rule="core-without-memory")
    r = apply(controlplane, WARN_NS, half_bad("half-bad"))
    assert r.returncode == 0, r.stderr
    assert WOULD_DENY + message in r.stderr
    obj = stored(controlplane, WARN_NS, "half-bad")
    assert obj["spec"]["schedulerName"] == "hami-scheduler"
    bad_limits, bad_requests = resources(obj, 0)
    assert bad_limits == bad_requests == {VGPU: "1", CORE: "4"}  # left as written (requests: API defaulting)
    assert resources(obj, 1) == ({VGPU: "1", MEMORY: "32"}, {VGPU: "1", MEMORY: "32"})  # snapped, as under deny
    # counted once by the mutating webhook and once by the validating webhook, which sees the same container
    assert metric(webhook, "hami_mt_webhook_would_deny_total", rule="core-without-memory") == before + 2


def test_the_backstop_warns_in_a_namespace_labelled_warn(controlplane, webhook, namespaces):
    r = apply(controlplane, DENY_NS, ignored("ignored"))
    assert r.returncode != 0 and "label skips the mutation only" in r.stderr
    r = apply(controlplane, WARN_NS, ignored("ignored"))
    assert r.returncode == 0, r.stderr
    assert WOULD_DENY + 'container "c0" asks for sGPU slices but spec.schedulerName is default-scheduler' in r.stderr
    assert "ValidatingAdmissionPolicy 'hami-mt-backstop' with binding 'hami-mt-backstop-warn'" in r.stderr
    assert stored(controlplane, WARN_NS, "ignored")["spec"]["schedulerName"] == "default-scheduler"


def test_a_workload_in_a_namespace_labelled_warn_gets_its_denial_as_a_warning(controlplane, webhook, namespaces):
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "core-only"},
                  "spec": {"selector": {"matchLabels": {"app": "core-only"}}, "template": {
                      "metadata": {"labels": {"app": "core-only"}},
                      "spec": {"containers": [{"name": "main", "image": IMAGE,
                                               "resources": {"limits": {VGPU: "1", CORE: "4"}}}]}}}}
    r = apply(controlplane, DENY_NS, deployment, "--dry-run=server")
    prefix = 'admission webhook "validate-workloads.hami-mt.mthreads.com" denied the request: '
    assert r.returncode != 0 and prefix in r.stderr
    message = r.stderr.split(prefix, 1)[1].strip()
    assert message.startswith('Deployment "core-only": container "main": mthreads.com/sgpu-core 4 without')
    r = apply(controlplane, WARN_NS, deployment, "--dry-run=server")
    assert r.returncode == 0 and WOULD_DENY + message in r.stderr


@pytest.fixture
def warn_everywhere(controlplane: ControlPlane, webhook: LocalWebhook, namespaces,
                    tmp_path: Path) -> Iterator[LocalWebhook]:
    """The registrations pointed at a webhook started with --enforcement warn, and the backstop's binding at
    [Warn, Audit], as components/warn or the chart's `enforcement: warn` make them; restored afterwards."""
    hook = LocalWebhook(controlplane, tmp_path, extra_args=["--enforcement", "warn"],
                        certs_dir=webhook.certs.tls_cert.parent)
    hook.install()
    hook.start()
    binding = ["patch", "validatingadmissionpolicybinding", "hami-mt-backstop", "--type=json", "-p"]
    controlplane.kubectl(*binding, '[{"op": "replace", "path": "/spec/validationActions", "value": ["Warn", "Audit"]}]')
    mixed, skipped = pod("probe", {WHOLE: 1, VGPU: 1}), ignored("probe")

    def answered_by(mode: str) -> bool:
        """Registrations and bindings reach the API server through caches: both must have switched."""
        r = apply(controlplane, DENY_NS, mixed, "--dry-run=server")
        if mode == "warn":  # neither the webhook nor the backstop denies a mixing container
            return r.returncode == 0
        return DENIED in r.stderr and "binding 'hami-mt-backstop' denied" in apply(
            controlplane, DENY_NS, skipped, "--dry-run=server").stderr

    try:
        wait_for("the API server calls the warn webhook and warns by the backstop", lambda: answered_by("warn"))
        yield hook
    finally:
        webhook.install()
        controlplane.kubectl(*binding, '[{"op": "replace", "path": "/spec/validationActions", "value": ["Deny"]}]')
        wait_for("the API server calls the session webhook and denies by the backstop again",
                 lambda: answered_by("deny"))
        hook.stop()


def test_cluster_wide_warn(controlplane, warn_everywhere, namespaces):
    mixed = pod("mixed", {WHOLE: 1, VGPU: 1}, {VGPU: 1, MEMORY: 8}, nodeSelector=ON_S5000)
    before = metric(warn_everywhere, "hami_mt_webhook_would_deny_total", rule="mixing")
    r = apply(controlplane, DENY_NS, mixed)
    assert r.returncode == 0, r.stderr
    assert WOULD_DENY + 'container "c0" asks for mthreads.com/gpu (whole cards, outside HAMi) and for ' \
                        "mthreads.com/vgpu (sGPU slices) at once" in r.stderr
    # and the backstop, bound cluster-wide with [Warn, Audit], warns about the same container
    assert "ValidatingAdmissionPolicy 'hami-mt-backstop' with binding 'hami-mt-backstop'" in r.stderr
    obj = stored(controlplane, DENY_NS, "mixed")
    assert obj["spec"]["schedulerName"] == "hami-scheduler"
    assert resources(obj, 0)[0] == {WHOLE: "1", VGPU: "1"}  # the mixing container is left as written
    assert resources(obj, 1)[0] == {VGPU: "1", MEMORY: "8"}
    assert metric(warn_everywhere, "hami_mt_webhook_would_deny_total", rule="mixing") == before + 2
    r = apply(controlplane, DENY_NS, ignored("ignored-everywhere"))
    assert r.returncode == 0 and "with binding 'hami-mt-backstop'" in r.stderr
