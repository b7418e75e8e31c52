"""validate-workloads through kube-apiserver: bad pod templates are refused at `kubectl apply`, never patched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .support import EXAMPLES, IMAGE, MEMORY, ON_S4000, VGPU, WHOLE, apply, check_example, custom, metric, namespace

DENIED = 'admission webhook "validate-workloads.hami-mt.mthreads.com" denied the request: '
GROUPS = {"Deployment": "apps", "StatefulSet": "apps", "DaemonSet": "apps", "ReplicaSet": "apps", "Job": "batch",
          "CronJob": "batch"}


ns = namespace("e2e-workloads")


def workload(kind: str, name: str, limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A minimal valid workload of `kind` whose one container has `limits`."""
    pod_spec: dict[str, Any] = {"containers": [{"name": "main", "image": IMAGE,
                                                "resources": {"limits": {k: str(v) for k, v in limits.items()}}}],
                                **spec}
    labels = {"app": name}  # shared by selector and template: change the template through its annotations
    if kind in ("Job", "CronJob"):
        pod_spec["restartPolicy"] = "Never"
        template: dict[str, Any] = {"metadata": {"labels": labels}, "spec": pod_spec}
        job = {"template": template}
        body: dict[str, Any] = {"jobTemplate": {"spec": job}, "schedule": "0 2 * * *"} if kind == "CronJob" else job
    else:
        body = {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": pod_spec}}
        if kind == "StatefulSet":
            body["serviceName"] = name
    return {"apiVersion": f"{GROUPS[kind]}/v1", "kind": kind, "metadata": {"name": name}, "spec": body}


def exists(cp, ns: str, kind: str, name: str) -> bool:
    return cp.kubectl("get", kind.lower(), "-n", ns, name, check=False).returncode == 0


def test_deployment_with_a_mixed_container_is_denied_at_apply(controlplane, ns):
    r = apply(controlplane, ns, workload("Deployment", "mixed", {WHOLE: 1, VGPU: 1}), "--dry-run=server")
    assert r.returncode != 0
    assert DENIED + 'Deployment "mixed": container "main" asks for mthreads.com/gpu (whole cards, outside HAMi) ' \
                    "and for mthreads.com/vgpu (sGPU slices) at once" in r.stderr
    assert "remove mthreads.com/gpu to share a card" in r.stderr
    assert not exists(controlplane, ns, "Deployment", "mixed")


def test_valid_deployment_gets_warnings_and_is_not_patched(controlplane, ns):
    r = apply(controlplane, ns, workload("Deployment", "whole", {VGPU: 1}, nodeSelector=ON_S4000),
              "--dry-run=server", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert 'Warning: Deployment "whole": container "main": mthreads.com/vgpu 1 alone takes a whole card: set ' \
           "mthreads.com/sgpu-core 16 and mthreads.com/sgpu-memory 96 (48 GiB)" in r.stderr
    answered = json.loads(r.stdout)
    pod_spec = answered["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["resources"]["limits"] == {VGPU: "1"}  # the template is never mutated
    assert pod_spec["schedulerName"] == "default-scheduler"
    assert not exists(controlplane, ns, "Deployment", "whole")  # dry-run stores nothing


@pytest.mark.parametrize("kind", sorted(GROUPS))
def test_every_kind_has_its_template_checked(controlplane, ns, kind):
    name = f"core-only-{kind.lower()}"
    r = apply(controlplane, ns, workload(kind, name, {VGPU: 1, "mthreads.com/sgpu-core": 4}), "--dry-run=server")
    assert r.returncode != 0
    assert DENIED + f'{kind} "{name}": container "main": mthreads.com/sgpu-core 4 without ' \
                    "mthreads.com/sgpu-memory" in r.stderr
    assert not exists(controlplane, ns, kind, name)


def test_cronjob_template_is_checked(controlplane, ns):
    bad = workload("CronJob", "nightly", {VGPU: 1, MEMORY: 128}, nodeSelector=ON_S4000)
    r = apply(controlplane, ns, bad, "--dry-run=server")
    assert r.returncode != 0
    assert DENIED + 'CronJob "nightly": container "main": mthreads.com/sgpu-memory 128 (64 GiB) is more than ' \
                    "the largest card, 96 (48 GiB)" in r.stderr
    good = workload("CronJob", "nightly", {VGPU: 1, MEMORY: 20, "mthreads.com/sgpu-core": 4})
    r = apply(controlplane, ns, good, "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert "snapped up to 32 (16 GiB)" in r.stderr
    assert not exists(controlplane, ns, "CronJob", "nightly")


EXAMPLE_FILES = sorted(p.stem for p in EXAMPLES.glob("*.yaml") if p.stem != "nodes" and not custom(p))


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_examples_print_what_review_prints(controlplane, ns, example):
    """The cluster says what `review` says (examples/expected), so the docs quoting either are right."""
    check_example(controlplane, ns, example)


def test_update_keeps_working_for_a_template_created_before_the_webhook(controlplane, ns):
    """A bad Deployment stored while the webhook skipped it can still be scaled; changing its template is checked."""
    legacy = "e2e-workloads-legacy"
    controlplane.kubectl("create", "namespace", legacy)
    controlplane.kubectl("label", "namespace", legacy, "hami.io/webhook=ignore")
    bad = workload("Deployment", "legacy", {WHOLE: 1, VGPU: 1})
    r = apply(controlplane, legacy, bad)
    assert r.returncode == 0, r.stderr  # skipped by the namespaceSelector
    controlplane.kubectl("label", "namespace", legacy, "hami.io/webhook-")

    bad["spec"]["replicas"] = 3
    r = apply(controlplane, legacy, bad)
    assert r.returncode == 0, r.stderr
    assert 'Warning: Deployment "legacy": the pod template is unchanged, so this update is allowed, but its pods ' \
           'will be denied: container "main" asks for mthreads.com/gpu' in r.stderr
    replicas = controlplane.kubectl("get", "deployment", "-n", legacy, "legacy", "-o", "jsonpath={.spec.replicas}")
    assert replicas.stdout == "3"

    bad["spec"]["template"]["metadata"]["annotations"] = {"rev": "2"}  # a new template, still mixed
    r = apply(controlplane, legacy, bad)
    assert r.returncode != 0
    assert DENIED + 'Deployment "legacy": container "main" asks for' in r.stderr

    fixed = workload("Deployment", "legacy", {VGPU: 1, MEMORY: 32, "mthreads.com/sgpu-core": 8})
    r = apply(controlplane, legacy, fixed)
    assert r.returncode == 0, r.stderr
    stored = json.loads(controlplane.kubectl("get", "deployment", "-n", legacy, "legacy", "-o", "json").stdout)
    assert stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        VGPU: "1", MEMORY: "32", "mthreads.com/sgpu-core": "8"}


def test_workloads_without_mthreads_resources_are_never_sent(controlplane, ns, webhook):
    def reviews() -> float:
        return metric(webhook, "hami_mt_webhook_reviews_total", webhook="validate-workloads")

    before = reviews()
    plain = workload("Deployment", "plain", {"cpu": "100m"})
    r = apply(controlplane, ns, plain, "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert reviews() == before
    r = apply(controlplane, ns, workload("Deployment", "whole-only", {WHOLE: 1}), "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert reviews() == before  # whole cards only: never sent, so never blocked by an outage
    r = apply(controlplane, ns, workload("Deployment", "sent", {VGPU: 1, MEMORY: 32}), "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert reviews() == before + 1
