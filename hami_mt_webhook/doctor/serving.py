"""What serves this webhook, for the checks that read it and for fetch: the Deployments behind its Service
and the TLS Secrets they mount; the certificates in a caBundle or a Secret, and which one signs which."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from ..audit.objects import Obj, mapping, metadata, name_of, namespace_of, sequence
from ..rules.selectors import labels_match
from .model import Cluster, registered

# --- the Deployments behind the webhook's Service, and the Secrets they mount ---------------------------


def pod_labels(deploy: Mapping[str, Any]) -> Mapping[str, str]:
    template = mapping(mapping(deploy.get("spec")).get("template"))
    return mapping(metadata(template).get("labels"))


def deployments_behind(service: Mapping[str, Any], deployments: Iterable[Obj]) -> list[Obj]:
    """The Deployments in the Service's namespace whose pods its selector selects."""
    selector = mapping(mapping(service.get("spec")).get("selector"))
    return [d for d in deployments if selector and namespace_of(d) == namespace_of(service)
            and labels_match(selector, pod_labels(d))]


def service_for(cluster: Cluster, client_config: Mapping[str, Any]) -> Obj | None:
    """The Service a webhook calls, if it calls one and doctor read it."""
    svc = mapping(client_config.get("service"))
    if not svc:
        return None
    return next((s for s in cluster.services if namespace_of(s) == svc.get("namespace")
                 and name_of(s) == svc.get("name")), None)


def secret_volumes(deploy: Mapping[str, Any]) -> list[str]:
    """The names of the Secrets a Deployment's pods mount as volumes."""
    spec = mapping(mapping(mapping(deploy.get("spec")).get("template")).get("spec"))
    names = (mapping(mapping(volume).get("secret")).get("secretName") for volume in sequence(spec.get("volumes")))
    return [str(name) for name in names if name]


def mounted_secrets(cluster: Cluster, client_config: Mapping[str, Any]) -> list[tuple[Obj, str]]:
    """(Deployment, Secret name) for each Secret mounted by the Deployments behind the Service a webhook
    calls (the webhook's TLS Secret among them)."""
    service = service_for(cluster, client_config)
    if service is None:
        return []
    return [(deploy, name) for deploy in deployments_behind(service, cluster.deployments)
            for name in secret_volumes(deploy)]


def serving_secrets(cluster: Cluster) -> list[tuple[Obj, str]]:
    """The same for every webhook of this project, each Secret once, in order."""
    seen: dict[tuple[str, str], tuple[Obj, str]] = {}
    for _, _, hook in registered(cluster).values():
        for deploy, name in mounted_secrets(cluster, mapping(hook.get("clientConfig"))):
            seen.setdefault((namespace_of(deploy), name), (deploy, name))
    return list(seen.values())


def secret(cluster: Cluster, namespace: str, name: str) -> Obj | None:
    """A Secret doctor read."""
    return next((s for s in cluster.secrets if namespace_of(s) == namespace and name_of(s) == name), None)


# --- certificates ----------------------------------------------------------------------------------------

def pem_certificates(raw: Any) -> list[x509.Certificate]:
    """The certificates in base64 of PEM (a caBundle, a Secret's `tls.crt` or `ca.crt`); none if unreadable."""
    if not raw or not isinstance(raw, str | bytes):
        return []
    try:
        return x509.load_pem_x509_certificates(base64.b64decode(raw))
    except ValueError:
        return []


def bundle(hook: Mapping[str, Any]) -> list[x509.Certificate]:
    """The CAs of a webhook's caBundle."""
    return pem_certificates(mapping(hook.get("clientConfig")).get("caBundle"))


def common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


def signs(ca: x509.Certificate, leaf: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
        return True
    except (InvalidSignature, ValueError, TypeError):  # a wrong key, a name mismatch, an unsupported key type
        return False
