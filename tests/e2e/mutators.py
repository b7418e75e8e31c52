"""Other teams' mutators that run after ours: a mutating webhook served on loopback, and a way to ask whether
the API server serves MutatingAdmissionPolicy (admissionregistration.k8s.io/v1 from Kubernetes 1.36; beta
and off by default in 1.34 and 1.35, alpha before), so a test shows reinvocation with a policy where the
server has them and with a second webhook where it does not."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devtools.clusters.controlplane import ControlPlane
from hami_mt_webhook.service import certs

#: What a webhook does to a pod: (the request's path, the pod) -> a JSON Patch, empty to change nothing.
Patcher = Callable[[str, dict[str, Any]], list[dict[str, Any]]]


class LoopbackWebhook:
    """A mutating webhook on 127.0.0.1 with its own certificate; `patcher` decides each answer."""

    def __init__(self, workdir: Path, patcher: Patcher) -> None:
        layout = certs.ensure(workdir, ips=("127.0.0.1",))
        self.bundle = layout.bundle.read_bytes()
        self.calls = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["request"]
                owner.calls += 1
                patch = patcher(self.path.partition("?")[0], request["object"])  # kube-apiserver adds ?timeout=
                response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(layout.tls_cert, layout.tls_key)
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def configuration(self, name: str, path: str, object_selector: dict[str, Any]) -> dict[str, Any]:
        """A MutatingWebhookConfiguration calling `path` for the pods `object_selector` picks, reinvoked if needed.

        kube-apiserver calls webhooks in the order of their configurations' names: a name after
        "hami-mt-webhook" runs after ours."""
        return {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": f"{name}.e2e.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "clientConfig": {"url": f"https://127.0.0.1:{self._server.server_address[1]}{path}",
                                 "caBundle": base64.b64encode(self.bundle).decode()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": object_selector, "namespaceSelector": {},
                "failurePolicy": "Fail", "timeoutSeconds": 3, "reinvocationPolicy": "IfNeeded"}],
        }  # fmt: skip

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serves_mutating_policies(cp: ControlPlane) -> bool:
    """Whether the API server serves MutatingAdmissionPolicy at admissionregistration.k8s.io/v1."""
    listed = json.loads(cp.kubectl("get", "--raw", "/apis/admissionregistration.k8s.io/v1").stdout)
    return any(r["name"] == "mutatingadmissionpolicies" for r in listed["resources"])
