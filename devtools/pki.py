"""The local control plane's certificates and kubeconfigs: one private CA for every identity.

Each component logs in as the identity Kubernetes' bootstrap RBAC expects of it (`admin` in
system:masters, `system:kube-scheduler`, `system:kube-controller-manager`), so no component runs with
more rights than on a real cluster, and a test user gets none until RBAC grants some.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from hami_mt_webhook.service import certs

SERVICE_CIDR = "10.0.0.0/24"
#: The first address of SERVICE_CIDR: the `kubernetes` Service's cluster IP, so in-cluster names verify.
SERVICE_IP = "10.0.0.1"
APISERVER_DNS = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"]
CLUSTER_NAME = "hami-mt-local"


def write_pki(d: Path) -> certs.KeyPair:
    """The CA, the API server's serving pair, the admin pair, the webhook client pair and the
    service-account signing key, in `d`; returns the CA for issuing more identities."""
    ca = certs.new_ca("hami-mt-controlplane-ca")
    certs.write_pair(ca, d / "ca.crt", d / "ca.key")
    serving = certs.issue(ca, "kube-apiserver", dns=APISERVER_DNS, ips=["127.0.0.1", SERVICE_IP])
    certs.write_pair(serving, d / "apiserver.crt", d / "apiserver.key")
    admin = certs.issue(ca, "admin", orgs=["system:masters"], server=False, client=True)
    certs.write_pair(admin, d / "admin.crt", d / "admin.key")
    _write_admission_config(d, ca)
    sa = ec.generate_private_key(ec.SECP256R1())
    certs.write_atomic(d / "sa.key", sa.private_bytes(serialization.Encoding.PEM,
                                                      serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()), 0o600)
    certs.write_atomic(d / "sa.pub", sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return ca


def write_kubelet_client(d: Path, ca: certs.KeyPair) -> None:
    """The API server's client pair for kubelets (logs, exec, port-forward), in system:masters as kubeadm's
    `apiserver-kubelet-client` is: kubelets ask the API server whether it may."""
    pair = certs.issue(ca, "kube-apiserver-kubelet-client", orgs=["system:masters"], server=False, client=True)
    certs.write_pair(pair, d / "apiserver-kubelet-client.crt", d / "apiserver-kubelet-client.key")


def write_node_pki(d: Path, ca: certs.KeyPair, server: str, node: str, node_ip: str) -> Path:
    """A kubelet's identity: its client certificate (`system:node:<node>` in `system:nodes`, what Node
    authorization and NodeRestriction key on) in a kubeconfig for `server`, and its serving pair for
    `node_ip`, both signed by `ca`, in `d`; returns the kubeconfig."""
    serving = certs.issue(ca, f"system:node:{node}", dns=[node, "localhost"], ips=["127.0.0.1", node_ip])
    certs.write_pair(serving, d / "kubelet-serving.crt", d / "kubelet-serving.key")
    client = certs.issue(ca, f"system:node:{node}", orgs=["system:nodes"], server=False, client=True)
    return write_kubeconfig(d / "kubelet.kubeconfig", server, ca.cert_pem(), f"system:node:{node}",
                            client.cert_pem(), client.key_pem())


def _write_admission_config(d: Path, ca: certs.KeyPair) -> None:
    """An AdmissionConfiguration giving the API server a client certificate for every webhook it calls.

    As on a real cluster where webhooks check the caller (`--client-ca`): the webhook plugins read a
    kubeconfig whose user `*` matches any webhook host, and present its certificate in the TLS handshake.
    """
    client = certs.issue(ca, "kube-apiserver-webhook-client", server=False, client=True)
    certs.write_pair(client, d / "webhook-client.crt", d / "webhook-client.key")
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": {
        "client-certificate": str(d / "webhook-client.crt"), "client-key": str(d / "webhook-client.key")}}]}
    certs.write_atomic(d / "admission.kubeconfig", yaml.safe_dump(kubeconfig).encode(), 0o600)
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(d / "admission.kubeconfig")}
    config = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
              "plugins": [{"name": name, "configuration": plugin}
                          for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}
    certs.write_atomic(d / "admission.yaml", yaml.safe_dump(config, sort_keys=False).encode())


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, user: str, cert: Path | bytes,
                     key: Path | bytes) -> Path:
    """A self-contained kubeconfig (data embedded), so it can be copied or mounted on its own."""
    def b64(v: Path | bytes) -> str:
        return base64.b64encode(v.read_bytes() if isinstance(v, Path) else v).decode()

    config = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": CLUSTER_NAME,
                      "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user,
                   "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": user, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": user,
    }
    certs.write_atomic(path, yaml.safe_dump(config, sort_keys=False).encode(), 0o600)
    return path


def user_kubeconfig(d: Path, ca: certs.KeyPair, server: str, name: str, groups: Iterable[str] = ()) -> Path:
    """A kubeconfig in `d` for user `name` in `groups`, signed by `ca`; rights come from RBAC alone."""
    pair = certs.issue(ca, name, orgs=list(groups), server=False, client=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return write_kubeconfig(d / f"user-{safe}.kubeconfig", server, ca.cert_pem(), name, pair.cert_pem(),
                            pair.key_pem())
