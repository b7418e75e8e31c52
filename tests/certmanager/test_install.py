"""cert-manager as users run it: a self-signed ClusterIssuer makes a CA, a CA Issuer signs a leaf with it, and a
renewal triggered as `cmctl renew` triggers it replaces the leaf."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import yaml
from cryptography import x509

from devtools.clusters.nodes import NodeCluster
from devtools.waiting import until

from .conftest import MEASURED

NAMESPACE = "certmanager-test"


def _apply(cluster: NodeCluster, *objects: dict[str, object]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))


def _certificate(name: str, issuer: dict[str, str], **spec: object) -> dict[str, object]:
    return {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"secretName": name, "issuerRef": {"group": "cert-manager.io", **issuer}, **spec}}


def _wait_ready(cluster: NodeCluster, name: str, timeout: int = 60) -> float:
    started = time.monotonic()
    cluster.kubectl("wait", f"certificate/{name}", "-n", NAMESPACE, "--for=condition=Ready",
                    f"--timeout={timeout}s", timeout=timeout + 10)
    return time.monotonic() - started


def _secret_certs(cluster: NodeCluster, name: str) -> tuple[x509.Certificate, x509.Certificate]:
    """The Secret's tls.crt (the first certificate) and ca.crt."""
    data = json.loads(cluster.kubectl("get", "secret", name, "-n", NAMESPACE, "-o", "json").stdout)["data"]
    return (x509.load_pem_x509_certificates(base64.b64decode(data["tls.crt"]))[0],
            x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"])))


def test_ca_chain_issues_and_renews_a_leaf(cluster: NodeCluster) -> None:
    cluster.kubectl("create", "namespace", NAMESPACE)
    started = time.monotonic()
    _apply(cluster,
           {"apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer", "metadata": {"name": "selfsigned"},
            "spec": {"selfSigned": {}}},
           _certificate("test-ca", {"kind": "ClusterIssuer", "name": "selfsigned"}, isCA=True,
                        commonName="hami-mt test CA", privateKey={"algorithm": "ECDSA", "size": 256}),
           {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "ca", "namespace": NAMESPACE},
            "spec": {"ca": {"secretName": "test-ca"}}})
    _wait_ready(cluster, "test-ca")
    ca_seconds = time.monotonic() - started
    cluster.kubectl("wait", "issuer/ca", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=30s", timeout=40)

    started = time.monotonic()
    _apply(cluster, _certificate("leaf", {"kind": "Issuer", "name": "ca"}, dnsNames=["leaf.example.test"],
                                 privateKey={"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}))
    _wait_ready(cluster, "leaf")
    leaf_seconds = time.monotonic() - started
    leaf, ca = _secret_certs(cluster, "leaf")
    ca_cert, _ = _secret_certs(cluster, "test-ca")
    assert ca == ca_cert, "the leaf's ca.crt is not the CA Certificate's certificate"
    leaf.verify_directly_issued_by(ca)  # raises when the signature or issuer name does not match
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == ["leaf.example.test"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    # What `cmctl renew` does: the Issuing condition set True (reason ManuallyTriggered) through the status
    # subresource, beside the conditions the Certificate has.
    crt = json.loads(cluster.kubectl("get", "certificate", "leaf", "-n", NAMESPACE, "-o", "json").stdout)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [c for c in crt["status"].get("conditions", []) if c["type"] != "Issuing"]
    conditions.append({"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                       "message": "Certificate re-issuance manually triggered", "lastTransitionTime": now,
                       "observedGeneration": crt["metadata"]["generation"]})
    started = time.monotonic()
    cluster.kubectl("patch", "certificate", "leaf", "-n", NAMESPACE, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"conditions": conditions}}))

    def new_leaf() -> x509.Certificate | None:
        cert, _ = _secret_certs(cluster, "leaf")
        return cert if cert.serial_number != leaf.serial_number else None

    renewed = until("a new certificate in the Secret after the renewal", new_leaf, 20, 0.2)
    renew_seconds = time.monotonic() - started
    renewed.verify_directly_issued_by(ca)
    assert renewed.public_key() != leaf.public_key(), "rotationPolicy Always: a new key"
    _wait_ready(cluster, "leaf")
    MEASURED.append(f"self-signed CA Certificate Ready in {ca_seconds:.1f} s; a leaf from the CA Issuer Ready in "
                    f"{leaf_seconds:.1f} s; renewal (Issuing=True, ManuallyTriggered) to a new serial in the "
                    f"Secret in {renew_seconds:.1f} s")


def test_each_component_leads_through_its_lease_and_never_restarted(cluster: NodeCluster) -> None:
    leases = cluster.kubectl("get", "leases", "-n", "kube-system", "-o", "name").stdout.split()
    assert {"lease.coordination.k8s.io/cert-manager-controller",
            "lease.coordination.k8s.io/cert-manager-cainjector-leader-election"} <= set(leases)
    pods = json.loads(cluster.kubectl("get", "pods", "-n", "cert-manager", "-o", "json").stdout)["items"]
    restarts = {p["metadata"]["name"]: sum(s["restartCount"] for s in p["status"]["containerStatuses"])
                for p in pods}
    assert len(restarts) == 3 and not any(restarts.values()), restarts
    # The cainjector put the webhook's CA into the webhook configurations (the chart asks it to).
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        bundle = cluster.kubectl("get", kind, "cert-manager-webhook", "-o",
                                 "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout
        assert x509.load_pem_x509_certificate(base64.b64decode(bundle))
