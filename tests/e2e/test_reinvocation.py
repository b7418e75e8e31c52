"""Other mutators after ours: a second mutating webhook changes the pod (ours is called again and changes
nothing), and another team's mutator injects a slice sidecar or changes a container's memory (ours is
called again: the final pod is still filled, snapped and checked). That mutator is a MutatingAdmissionPolicy
where the API server serves them (admissionregistration.k8s.io/v1, Kubernetes 1.36 on), and a mutating
webhook sorted after ours where it does not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .mutators import LoopbackWebhook, serves_mutating_policies
from .support import CORE, MEMORY, ON_S5000, VGPU, apply, exists, metric, pod, resources, stored, wait_for

LABEL = "e2e.hami-mt/labelled"


def label(path: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Adds a label to every pod it is sent: another team's mutating webhook."""
    if LABEL in (obj["metadata"].get("labels") or {}):
        return []
    return [{"op": "add", "path": f"/metadata/labels/{LABEL.replace('/', '~1')}", "value": "yes"}]


@pytest.fixture
def labeler(controlplane, webhook, tmp_path: Path) -> Iterator[LoopbackWebhook]:
    server = LoopbackWebhook(tmp_path / "labeler", label)
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump(  # "zz-" sorts after hami-mt-webhook
        server.configuration("zz-labeler", "/label", {"matchLabels": {"e2e-reinvoke": "yes"}})))
    try:
        yield server
    finally:
        controlplane.kubectl("delete", "mutatingwebhookconfiguration", "zz-labeler", check=False)
        server.close()


def test_reinvocation_keeps_the_result_correct_and_idempotent(controlplane, webhook, labeler):
    ns = "e2e-reinvoke"
    controlplane.kubectl("create", "namespace", ns)
    def mutations() -> float:
        return metric(webhook, "hami_mt_webhook_reviews_total", webhook="mutate-pods")

    before = mutations()
    r = apply(controlplane, ns, pod("twice", {VGPU: 1}, labels={"e2e-reinvoke": "yes"}, nodeSelector=ON_S5000))
    assert r.returncode == 0, r.stderr
    obj = stored(controlplane, ns, "twice")
    assert obj["metadata"]["labels"][LABEL] == "yes"
    assert obj["spec"]["schedulerName"] == "hami-scheduler"
    limits, requests = resources(obj)
    assert limits == requests == {VGPU: "1", MEMORY: "160", CORE: "16"}
    assert labeler.calls >= 1
    assert mutations() == before + 2  # called again after the labeler, and patched nothing more
    assert 'result="allowed"' in webhook.metrics()  # the second call was an allowed no-op


# --- a MutatingAdmissionPolicy after the webhook -----------------------------------------------------------------

SIDECAR = "telemetry"
MAP_LABEL = "e2e-map"


def policy(name: str, mutation: str) -> list[dict]:
    """A MutatingAdmissionPolicy (admissionregistration.k8s.io/v1) and its binding for pods labelled MAP_LABEL=name.

    The mutation applies only to pods our webhook has already mutated (schedulerName hami-scheduler): the
    API server runs policies before webhooks, so the change happens when the policy is reinvoked after our
    webhook's patch (reinvocationPolicy IfNeeded), which is what another team's policy running after ours
    looks like. Our webhook, IfNeeded too, is then called again on the changed pod.
    """
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["CREATE"], "resources": ["pods"]}]},
                  "matchConditions": [{"name": "labelled", "expression":
                                       f"has(object.metadata.labels) && '{MAP_LABEL}' in object.metadata.labels && "
                                       f"object.metadata.labels['{MAP_LABEL}'] == '{name}'"}],
                  "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
                  "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": mutation}}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": name}, "spec": {"policyName": name}},
    ]


#: Adds a sidecar asking for 20 units of sgpu-memory (not a tier) once the pod is on hami-scheduler.
INJECT_SIDECAR = (
    "object.spec.schedulerName == 'hami-scheduler' && !object.spec.containers.exists(c, c.name == 'telemetry') ? "
    "Object{spec: Object.spec{containers: [Object.spec.containers{name: 'telemetry', image: 'busybox', "
    "resources: Object.spec.containers.resources{limits: {'mthreads.com/vgpu': '1', "
    "'mthreads.com/sgpu-memory': '20'}}}]}} : Object{}")
#: Sets the main container's sgpu-memory (limits and requests) to 20 units once the pod is on hami-scheduler.
SHRINK_MEMORY = (
    "object.spec.schedulerName == 'hami-scheduler' ? "
    "Object{spec: Object.spec{containers: [Object.spec.containers{name: 'c0', "
    "resources: Object.spec.containers.resources{limits: {'mthreads.com/sgpu-memory': '20'}, "
    "requests: {'mthreads.com/sgpu-memory': '20'}}}]}} : Object{}")
#: The same, in limits only: the pod then asks for different limits and requests.
SHRINK_LIMIT = (
    "object.spec.schedulerName == 'hami-scheduler' ? "
    "Object{spec: Object.spec{containers: [Object.spec.containers{name: 'c0', "
    "resources: Object.spec.containers.resources{limits: {'mthreads.com/sgpu-memory': '20'}}}]}} : Object{}")


def _slices(memory: str) -> dict[str, str]:
    return {"mthreads.com/sgpu-memory": memory}


#: The three mutations as a webhook's JSON Patches, for servers without MutatingAdmissionPolicy: the same
#: changes, made once (a marker annotation), and only to pods ours has already sent to hami-scheduler.
PATCHES: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "sidecar": lambda obj: [{"op": "add", "path": "/spec/containers/-", "value": {
        "name": SIDECAR, "image": "busybox",
        "resources": {"limits": {"mthreads.com/vgpu": "1", **_slices("20")}}}}],
    "shrink": lambda obj: [{"op": "add", "path": f"/spec/containers/0/resources/{part}/mthreads.com~1sgpu-memory",
                            "value": "20"} for part in ("limits", "requests")],
    "shrink-limit": lambda obj: [{"op": "add", "path": "/spec/containers/0/resources/limits/mthreads.com~1sgpu-memory",
                                  "value": "20"}],
}
MARKER = "e2e.hami-mt/changed-after"


def after_ours(path: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    meta = obj["metadata"]
    name = (meta.get("labels") or {}).get(MAP_LABEL, "")
    if name not in PATCHES or obj["spec"].get("schedulerName") != "hami-scheduler" or \
            MARKER in (meta.get("annotations") or {}):
        return []
    marker = [{"op": "add", "path": "/metadata/annotations", "value": {}}] if not meta.get("annotations") else []
    marker.append({"op": "add", "path": f"/metadata/annotations/{MARKER.replace('/', '~1')}", "value": name})
    return marker + PATCHES[name](obj)


@pytest.fixture(scope="module")
def policies(controlplane, webhook, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ns = "e2e-map"
    controlplane.kubectl("create", "namespace", ns)
    server = None
    if serves_mutating_policies(controlplane):
        docs = [d for name, mutation in (("sidecar", INJECT_SIDECAR), ("shrink", SHRINK_MEMORY),
                                         ("shrink-limit", SHRINK_LIMIT)) for d in policy(name, mutation)]
    else:
        server = LoopbackWebhook(tmp_path_factory.mktemp("after-ours"), after_ours)
        docs = [server.configuration("zz-after-ours", "/", {"matchExpressions": [
            {"key": MAP_LABEL, "operator": "Exists"}]})]
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    # The API server reads admission configurations from an informer: wait until each acts (a dry run stores
    # nothing).
    for name, sign in (("sidecar", SIDECAR), ("shrink", 'container "c0": mthreads.com/sgpu-memory 20 (10 GiB)'),
                       ("shrink-limit", "limit 20 and request 64 differ")):
        probe = pod("probe", {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: name}, nodeSelector=ON_S5000)

        def acts(probe: dict = probe, sign: str = sign) -> bool:
            r = apply(controlplane, ns, probe, "--dry-run=server", "-o", "json")
            return sign in r.stdout + r.stderr

        wait_for(f"the change {name} is in force", acts)
    try:
        yield ns
    finally:
        for d in reversed(docs):
            controlplane.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], check=False)
        if server is not None:
            server.close()


def snapped(controlplane, ns: str, name: str, change: str, container: str) -> dict[str, Any]:
    """A 64-unit slice pod on the S5000 that the mutator after ours changes as `change` says (its MAP_LABEL):
    admitted, `container`'s 20 units snapped up to 32 when ours is called again. The pod as stored."""
    r = apply(controlplane, ns, pod(name, {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: change}, nodeSelector=ON_S5000))
    assert r.returncode == 0, r.stderr
    assert f'container "{container}": mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32 (16 GiB)' in r.stderr
    return stored(controlplane, ns, name)


def test_a_sidecar_injected_after_the_webhook_is_snapped_and_checked(controlplane, webhook, policies):
    obj = snapped(controlplane, policies, "sidecar", "sidecar", "telemetry")
    names = [c["name"] for c in obj["spec"]["containers"]]
    assert names == ["c0", SIDECAR]
    assert resources(obj, 1) == ({VGPU: "1", MEMORY: "32"}, {VGPU: "1", MEMORY: "32"})  # snapped, requests = limits
    assert resources(obj, 0) == ({VGPU: "1", MEMORY: "64"}, {VGPU: "1", MEMORY: "64"})
    assert obj["spec"]["schedulerName"] == "hami-scheduler"


def test_a_sidecar_that_does_not_fit_the_card_is_denied(controlplane, webhook, policies):
    """The injected sidecar shares the card with the main container: 160 + 32 units do not fit one card."""
    r = apply(controlplane, policies, pod("full", {VGPU: 1}, labels={MAP_LABEL: "sidecar"}, nodeSelector=ON_S5000))
    assert r.returncode != 0
    assert 'container "c0", container "telemetry" share one card but ask for mthreads.com/sgpu-memory 192' in r.stderr
    assert not exists(controlplane, policies, "full")


def test_memory_changed_after_the_webhook_is_snapped_again(controlplane, webhook, policies):
    obj = snapped(controlplane, policies, "shrunk", "shrink", "c0")
    assert resources(obj, 0) == ({VGPU: "1", MEMORY: "32"}, {VGPU: "1", MEMORY: "32"})


def test_a_limit_changed_after_the_webhook_is_denied(controlplane, webhook, policies):
    r = apply(controlplane, policies, pod("unequal", {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: "shrink-limit"},
                                          nodeSelector=ON_S5000))
    assert r.returncode != 0
    assert 'container "c0": mthreads.com/sgpu-memory limit 20 and request 64 differ' in r.stderr
    assert not exists(controlplane, policies, "unequal")
