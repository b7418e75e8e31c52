"""Other mutators after ours: a second mutating webhook changes the pod (ours is called again and changes
nothing), and MutatingAdmissionPolicies inject a slice sidecar or change a container's memory (ours is
called again: the final pod is still filled, snapped and checked)."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from hami_mt_webhook.service import certs

from .support import CORE, MEMORY, ON_S5000, VGPU, apply, exists, metric, pod, resources, stored, wait_for

LABEL = "e2e.hami-mt/labelled"


class Labeler(BaseHTTPRequestHandler):
    """Adds a label to every pod it is sent: another team's mutating webhook."""

    calls = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        type(self).calls += 1
        labels = request["object"]["metadata"].get("labels") or {}
        patch = [] if LABEL in labels else [{"op": "add", "path": f"/metadata/labels/{LABEL.replace('/', '~1')}",
                                              "value": "yes"}]
        response = {"uid": request["uid"], "allowed": True}
        if patch:
            response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def labeler(controlplane, webhook, tmp_path: Path) -> Iterator[type[Labeler]]:
    layout = certs.ensure(tmp_path / "labeler", ips=("127.0.0.1",))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Labeler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(layout.tls_cert, layout.tls_key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "zz-labeler"},  # sorts after hami-mt-webhook: runs after ours
        "webhooks": [{
            "name": "labeler.e2e.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": f"https://127.0.0.1:{server.server_address[1]}/label",
                             "caBundle": base64.b64encode(layout.bundle.read_bytes()).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {"e2e-reinvoke": "yes"}},
            "failurePolicy": "Fail", "timeoutSeconds": 3, "reinvocationPolicy": "IfNeeded"}],
    }
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))
    Labeler.calls = 0
    try:
        yield Labeler
    finally:
        controlplane.kubectl("delete", "mutatingwebhookconfiguration", "zz-labeler", check=False)
        server.shutdown()


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


@pytest.fixture(scope="module")
def policies(controlplane, webhook) -> Iterator[str]:
    ns = "e2e-map"
    controlplane.kubectl("create", "namespace", ns)
    docs = [d for name, mutation in (("sidecar", INJECT_SIDECAR), ("shrink", SHRINK_MEMORY),
                                     ("shrink-limit", SHRINK_LIMIT)) for d in policy(name, mutation)]
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    # The API server compiles policies from an informer: wait until each acts (a dry run stores nothing).
    for name, sign in (("sidecar", SIDECAR), ("shrink", 'container "c0": mthreads.com/sgpu-memory 20 (10 GiB)'),
                       ("shrink-limit", "limit 20 and request 64 differ")):
        probe = pod("probe", {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: name}, nodeSelector=ON_S5000)

        def acts(probe: dict = probe, sign: str = sign) -> bool:
            r = apply(controlplane, ns, probe, "--dry-run=server", "-o", "json")
            return sign in r.stdout + r.stderr

        wait_for(f"policy {name} is in force", acts)
    try:
        yield ns
    finally:
        for d in reversed(docs):
            controlplane.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], check=False)


def test_a_sidecar_injected_after_the_webhook_is_snapped_and_checked(controlplane, webhook, policies):
    r = apply(controlplane, policies, pod("sidecar", {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: "sidecar"},
                                          nodeSelector=ON_S5000))
    assert r.returncode == 0, r.stderr
    assert 'container "telemetry": mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32 (16 GiB)' in r.stderr
    obj = stored(controlplane, policies, "sidecar")
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
    r = apply(controlplane, policies, pod("shrunk", {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: "shrink"},
                                          nodeSelector=ON_S5000))
    assert r.returncode == 0, r.stderr
    assert 'container "c0": mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32 (16 GiB)' in r.stderr
    obj = stored(controlplane, policies, "shrunk")
    assert resources(obj, 0) == ({VGPU: "1", MEMORY: "32"}, {VGPU: "1", MEMORY: "32"})


def test_a_limit_changed_after_the_webhook_is_denied(controlplane, webhook, policies):
    r = apply(controlplane, policies, pod("unequal", {VGPU: 1, MEMORY: 64}, labels={MAP_LABEL: "shrink-limit"},
                                          nodeSelector=ON_S5000))
    assert r.returncode != 0
    assert 'container "c0": mthreads.com/sgpu-memory limit 20 and request 64 differ' in r.stderr
    assert not exists(controlplane, policies, "unequal")
