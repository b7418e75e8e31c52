"""`--client-ca` through kube-apiserver: the API server shows the client certificate its AdmissionConfiguration
names, the webhook admits its reviews, and a caller without a certificate is refused."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from devtools.clusters.local import LocalWebhook
from hami_mt_webhook.service import certs

from .support import VGPU, apply, namespace, pod, stored

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u1", "operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                      "object": pod("direct", {"cpu": "10m"})}}


ns = namespace("e2e-client-ca")


@pytest.fixture
def requiring_client_certs(controlplane, webhook: LocalWebhook) -> Iterator[LocalWebhook]:
    """The session's webhook restarted with `--client-ca` (the CA of the API server's webhook client cert)."""
    webhook.stop()
    webhook.extra_args += ["--client-ca", str(controlplane.webhook_client_ca)]
    try:
        webhook.start()
        yield webhook
    finally:
        webhook.stop()
        del webhook.extra_args[-2:]
        webhook.start()


def post(hook: LocalWebhook, cert: tuple[str, str] | None = None) -> int:
    ctx = ssl.create_default_context(cafile=str(hook.certs.ca_cert))
    if cert:
        ctx.load_cert_chain(*cert)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    req = urllib.request.Request(f"{hook.url}/mutate-pods", data=json.dumps(REVIEW).encode(),
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=10) as resp:
        return resp.status


def test_api_server_presents_its_client_certificate(controlplane, ns, requiring_client_certs, tmp_path):
    r = apply(controlplane, ns, pod("through-apiserver", {VGPU: 1}))
    assert r.returncode == 0, r.stderr
    assert stored(controlplane, ns, "through-apiserver")["spec"]["schedulerName"] == "hami-scheduler"

    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        post(requiring_client_certs)  # no certificate
    stranger = certs.new_ca("not-the-api-servers-ca")
    pair = certs.issue(stranger, "kube-apiserver", server=False, client=True)
    certs.write_pair(pair, tmp_path / "c.crt", tmp_path / "c.key")
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        post(requiring_client_certs, (str(tmp_path / "c.crt"), str(tmp_path / "c.key")))
    # The same request with a certificate from the API server's CA is answered: the refusals were the certificate.
    cp_dir = controlplane.workdir
    assert post(requiring_client_certs, (str(cp_dir / "webhook-client.crt"), str(cp_dir / "webhook-client.key"))) == 200
