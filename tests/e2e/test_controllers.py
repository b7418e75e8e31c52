"""The path most slice pods take: a controller creates them, the webhook mutates them, hami-scheduler
binds them, and a ResourceQuota counts them (kube-controller-manager and kube-scheduler from
`ControlPlane(controllers=True)`).

The module has its own two nodes, an S4000 (one card: 96 units) and an S5000 (eight: 1280), tainted so
that only its pods (which tolerate the taint) land there: other modules' pods cannot take their units.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from devtools.clusters.helm_release import apply_nodes
from devtools.waiting import until

from .support import CORE, IMAGE, MEMORY, VGPU, apply, stored

POOL = "e2e.example.com/pool"
S4000, S5000 = "ctl-s4000", "ctl-s5000"
ON = {S4000: {POOL: "controllers", "mthreads.com/gpu.product": "MTT-S4000"},
      S5000: {POOL: "controllers", "mthreads.com/gpu.product": "MTT-S5000"}}
TOLERATE = [{"key": POOL, "operator": "Equal", "value": "controllers", "effect": "NoSchedule"}]
MUTATE_DENIED = 'admission webhook "mutate.hami-mt.mthreads.com" denied the request: '


def node(name: str, cards: int, per_card: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {**ON[name], "kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": POOL, "value": "controllers", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "mthreads.com/gpu": str(cards),
                                    CORE: str(16 * cards), MEMORY: str(per_card * cards)}}}



def get(cp, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def pods_of(cp, ns: str, app: str) -> list[dict[str, Any]]:
    return get(cp, "pods", "-n", ns, "-l", f"app={app}")["items"]


def bound(cp, ns: str, app: str, count: int) -> list[dict[str, Any]]:
    """Wait until `count` pods labelled app=`app` exist and all are bound to a node."""
    def probe() -> list[dict[str, Any]] | None:
        pods = pods_of(cp, ns, app)
        return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None
    return until(f"{count} bound pods of app={app} in {ns}", probe)


def template(app: str, limits: dict[str, Any], on: str, **spec: Any) -> dict[str, Any]:
    resources = {"limits": {k: str(v) for k, v in limits.items()}}
    return {"metadata": {"labels": {"app": app}}, "spec": {
        "containers": [{"name": "main", "image": IMAGE, "resources": resources}],
        "nodeSelector": ON[on], "tolerations": TOLERATE, **spec}}


def workload(kind: str, name: str, limits: dict[str, Any], on: str = S5000, **spec: Any) -> dict[str, Any]:
    group = "batch/v1" if kind in ("Job", "CronJob") else "apps/v1"
    if kind in ("Job", "CronJob"):
        job = {"template": template(name, limits, on, restartPolicy="Never")}
        body: dict[str, Any] = {"schedule": "0 2 * * *", "jobTemplate": {"spec": job}} if kind == "CronJob" else job
    else:
        body = {"selector": {"matchLabels": {"app": name}}, "template": template(name, limits, on), **spec}
    return {"apiVersion": group, "kind": kind, "metadata": {"name": name}, "spec": body}


def slices(pod: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    r = pod["spec"]["containers"][0]["resources"]
    keep = (VGPU, MEMORY, CORE)
    return ({k: v for k, v in r["limits"].items() if k in keep}, {k: v for k, v in r["requests"].items() if k in keep})


def used(cp, node_name: str) -> int:
    """The sgpu-memory the pods bound to `node_name` request: what the scheduler counts against allocatable."""
    pods = get(cp, "pods", "-A", f"--field-selector=spec.nodeName={node_name}")["items"]
    return sum(int(c["resources"].get("requests", {}).get(MEMORY, 0)) for p in pods for c in p["spec"]["containers"])


def admitted(pod: dict[str, Any], memory: str, core: str = "16") -> None:
    """Mutated as the webhook does: hami-scheduler, filled or snapped, requests equal to limits."""
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    limits, requests = slices(pod)
    assert limits == requests == {VGPU: "1", MEMORY: memory, CORE: core}


@pytest.fixture(scope="module")
def ns(controlplane, webhook):
    name = "e2e-controllers"
    controlplane.kubectl("create", "namespace", name)
    apply_nodes(controlplane, [node(S4000, 1, 96), node(S5000, 8, 160)])
    # The webhook's node view is a watch: wait until it fills an S5000 pod from the new node (its fallback is 96).
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": template("probe", {VGPU: 1},
                                                                                            S5000)["spec"]}
    until("the webhook's view of the module's nodes", lambda: (r := apply(
        controlplane, name, probe, "--dry-run=server", "-o", "json")).returncode == 0 and
        slices(json.loads(r.stdout))[0].get(MEMORY) == "160")
    return name


def test_a_deployment_s_pods_are_mutated_bound_and_scaled(controlplane, ns):
    before = used(controlplane, S5000)
    r = apply(controlplane, ns, workload("Deployment", "exclusive", {VGPU: 1}, replicas=1))
    assert r.returncode == 0, r.stderr
    (pod,) = bound(controlplane, ns, "exclusive", 1)
    admitted(pod, "160")
    assert pod["spec"]["nodeName"] == S5000
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert used(controlplane, S5000) - before == 160  # an exclusive pod takes one card's 160 of the node's 1280
    controlplane.kubectl("scale", "deployment", "exclusive", "-n", ns, "--replicas=3")
    pods = bound(controlplane, ns, "exclusive", 3)
    assert {p["spec"]["nodeName"] for p in pods} == {S5000}
    assert used(controlplane, S5000) - before == 480


@pytest.mark.parametrize("kind", ["Job", "DaemonSet", "StatefulSet"])
def test_controllers_create_pods_the_webhook_mutates_and_the_scheduler_binds(controlplane, ns, kind):
    name = f"snap-{kind.lower()}"
    extra: dict[str, Any] = {}
    if kind == "StatefulSet":  # Parallel: no pod waits for another to run, which none ever does here
        extra = {"serviceName": name, "replicas": 2, "podManagementPolicy": "Parallel"}
    r = apply(controlplane, ns, workload(kind, name, {VGPU: 1, MEMORY: 20, CORE: 4}, **extra))
    assert r.returncode == 0, r.stderr
    assert "snapped up to 32" in r.stderr  # validate-workloads warns at apply what pod creation will change
    pods = bound(controlplane, ns, name, extra.get("replicas", 1))
    for pod in pods:
        admitted(pod, "32", core="4")
        assert pod["spec"]["nodeName"] == S5000
    owner = {"Job": "Job", "DaemonSet": "DaemonSet", "StatefulSet": "StatefulSet"}[kind]
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in pods} == {owner}


def test_a_triggered_cronjob_s_pod_is_mutated_and_bound(controlplane, ns):
    r = apply(controlplane, ns, workload("CronJob", "nightly", {VGPU: 1}))
    assert r.returncode == 0, r.stderr
    controlplane.kubectl("create", "job", "nightly-now", "--from=cronjob/nightly", "-n", ns)
    (pod,) = bound(controlplane, ns, "nightly", 1)
    admitted(pod, "160")
    assert pod["metadata"]["labels"]["job-name"] == "nightly-now"


def test_a_full_s4000_leaves_the_next_pod_pending_with_the_scheduler_s_reason(controlplane, ns):
    first = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s4000-whole", "labels": {"app": "s4000"}},
             "spec": template("s4000", {VGPU: 1}, S4000)["spec"]}
    r = apply(controlplane, ns, first)
    assert r.returncode == 0, r.stderr
    (pod,) = bound(controlplane, ns, "s4000", 1)
    admitted(pod, "96")  # the S4000's whole card
    assert used(controlplane, S4000) == 96
    second = {**first, "metadata": {"name": "s4000-more"},
              "spec": template("s4000-more", {VGPU: 1, MEMORY: 32, CORE: 4}, S4000)["spec"]}
    r = apply(controlplane, ns, second)
    assert r.returncode == 0, r.stderr  # admitted: the webhook judges the request, the scheduler the room

    def unschedulable() -> str | None:
        conditions = stored(controlplane, ns, "s4000-more")["status"].get("conditions", [])
        return next((c["message"] for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"
                     and c.get("reason") == "Unschedulable"), None)
    message = until("s4000-more marked Unschedulable", unschedulable)
    assert "Insufficient mthreads.com/sgpu-memory" in message
    assert not stored(controlplane, ns, "s4000-more")["spec"].get("nodeName")


@pytest.fixture
def workload_check_down(controlplane, webhook):
    """validate-workloads unreachable: its failurePolicy Ignore lets workloads through, as in an outage."""
    name = "hami-mt-webhook-workloads"
    url = get(controlplane, "validatingwebhookconfiguration", name)["webhooks"][0]["clientConfig"]["url"]
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": "https://127.0.0.1:1/x"}]
    controlplane.kubectl("patch", "validatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))
    try:
        yield
    finally:
        patch[0]["value"] = url
        controlplane.kubectl("patch", "validatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))


def test_a_replicaset_whose_pods_are_denied_shows_the_webhook_s_message(controlplane, ns, workload_check_down):
    bad = workload("Deployment", "core-only", {VGPU: 1, CORE: 4}, replicas=1)
    # The API server picks up the changed configuration within a moment; until then the check still denies.
    until("the Deployment created past the unreachable workload check",
          lambda: apply(controlplane, ns, bad).returncode == 0)

    def failed_create() -> list[str]:
        events = get(controlplane, "events", "-n", ns, "--field-selector=reason=FailedCreate")["items"]
        return [e["message"] for e in events if e["involvedObject"]["kind"] == "ReplicaSet"
                and e["involvedObject"]["name"].startswith("core-only-")]
    try:
        (message, *_) = until("a FailedCreate event on the ReplicaSet", failed_create)
        assert MUTATE_DENIED in message
        assert 'container "main": mthreads.com/sgpu-core 4 without mthreads.com/sgpu-memory' in message
        assert pods_of(controlplane, ns, "core-only") == []
    finally:
        # Its ReplicaSet would go on retrying (with backoff) for the whole session: every retry is a review
        # the other modules' counts would see.
        controlplane.kubectl("delete", "deployment", "core-only", "-n", ns, "--cascade=foreground")


# --- quota ------------------------------------------------------------------------------------------------------


def exclusive_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": IMAGE, "resources": {"limits": {VGPU: "1"}}}],
                     "nodeSelector": {"mthreads.com/gpu.product": "MTT-S5000"}}}


def quota(cp, ns: str, name: str, hard: dict[str, str]) -> None:
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("create", "quota", name, "-n", ns, "--hard=" + ",".join(f"{k}={v}" for k, v in hard.items()))
    # The API server refuses pods while a quota's status is unknown: wait for the quota controller's first count.
    until(f"quota {name} counted", lambda: get(cp, "resourcequota", name, "-n", ns).get("status", {}).get("hard"))


def test_a_requests_quota_counts_what_the_webhook_filled(controlplane, webhook):
    ns = "e2e-quota"
    quota(controlplane, ns, "gpu", {f"requests.{MEMORY}": "320", f"requests.{CORE}": "64"})
    for name in ("first", "second"):
        r = apply(controlplane, ns, exclusive_pod(name))
        assert r.returncode == 0, r.stderr
    r = apply(controlplane, ns, exclusive_pod("third"))
    assert r.returncode != 0
    assert f'pods "third" is forbidden: exceeded quota: gpu, requested: requests.{MEMORY}=160, ' \
           f"used: requests.{MEMORY}=320, limited: requests.{MEMORY}=320" in r.stderr
    used_now = until("the quota's usage", lambda: (u := get(controlplane, "resourcequota", "gpu", "-n", ns)
                                                   ["status"].get("used")) and u.get(f"requests.{MEMORY}") == "320"
                     and u)
    assert used_now == {f"requests.{MEMORY}": "320", f"requests.{CORE}": "32"}


def test_a_limits_quota_is_not_enforced_and_the_webhook_says_so(controlplane, webhook):
    ns = "e2e-quota-limits"
    quota(controlplane, ns, "hami", {f"limits.{MEMORY}": "320"})
    warning = (f"Warning: ResourceQuota 'hami' sets limits.{MEMORY}, which is not enforced by Kubernetes: "
               f"write requests.{MEMORY}")
    # The webhook learns of the quota through its watch; the first dry run may come before.
    until("the webhook's warning", lambda: warning in apply(controlplane, ns, exclusive_pod("dry"),
                                                            "--dry-run=server").stderr)
    for name in ("first", "second", "third"):  # 480 units against a "limit" of 320: all admitted
        r = apply(controlplane, ns, exclusive_pod(name))
        assert r.returncode == 0, r.stderr
        assert warning in r.stderr
    plain = apply(controlplane, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                                     "spec": {"containers": [{"name": "main", "image": IMAGE}]}})
    assert plain.returncode == 0 and "ResourceQuota" not in plain.stderr  # only pods that ask for slices
