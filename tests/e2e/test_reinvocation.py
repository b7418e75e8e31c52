"""A second mutating webhook changes the pod after ours: ours is called again and changes nothing."""

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

from .support import CORE, MEMORY, ON_S5000, VGPU, apply, metric, pod, resources, stored

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
