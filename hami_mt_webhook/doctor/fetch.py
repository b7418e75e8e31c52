"""Reading a cluster for the doctor: the API server's objects, and the certificate the webhook serves.

This is the doctor's only I/O, and it only reads (GET). The objects it needs everywhere are listed
cluster-wide (nodes, namespaces, pods not yet finished, Deployments, PodDisruptionBudgets,
ResourceQuotas, webhook configurations); without permission for one of them doctor cannot run. A few
it reads where allowed (the Services the webhooks call, HAMi's device ConfigMap, the webhook's TLS
Secret, and where the configurations name cert-manager its Certificates and Issuers and the CA's Secret):
a refusal there becomes a note, not a failure; so does a cluster without cert-manager's API.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
import yaml
from kubernetes import client
from kubernetes import config as kubeconfig_loader
from kubernetes.config.config_exception import ConfigException

from ..audit import objects, reports
from ..audit.objects import Obj
from . import cert_manager, model, serving
from .components import device_configmap
from .model import Cluster, Served

__all__ = ["Api", "CannotRun", "read"]

#: Objects per page of a list: a large cluster's pods arrive in pieces.
PAGE = 500
#: Seconds to connect to the API server, and to read one answer.
TIMEOUT = (5.0, 30.0)
#: Seconds for the TLS handshake with a webhook endpoint.
PROBE_TIMEOUT = 3.0
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"

LISTS = {
    "nodes": "/api/v1/nodes",
    "namespaces": "/api/v1/namespaces",
    "pods": "/api/v1/pods",
    "deployments": "/apis/apps/v1/deployments",
    "mutating": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "validating": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "pdbs": "/apis/policy/v1/poddisruptionbudgets",
    "quotas": "/api/v1/resourcequotas",
}
#: How a list is named in messages (and in the permission doctor needs).
WHAT = {
    "nodes": "nodes", "namespaces": "namespaces", "pods": "pods", "deployments": "deployments.apps",
    "mutating": "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    "validating": "validatingwebhookconfigurations.admissionregistration.k8s.io",
    "pdbs": "poddisruptionbudgets.policy", "quotas": "resourcequotas",
}


class CannotRun(Exception):
    """Doctor cannot read the cluster (no credentials, unreachable, refused): one line, exit status 2."""


class Api:
    """GETs against the API server of a kubeconfig, or of the pod's service account in a cluster."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        cfg = client.Configuration()
        try:
            if kubeconfig:
                kubeconfig_loader.load_kube_config(config_file=kubeconfig, client_configuration=cfg,
                                                   persist_config=False)
            elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                kubeconfig_loader.load_incluster_config(client_configuration=cfg)
            else:
                kubeconfig_loader.load_kube_config(client_configuration=cfg, persist_config=False)
        except (ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as err:
            where = kubeconfig or "the default kubeconfig (~/.kube/config) or the in-cluster service account"
            reason = " ".join(str(err).split())[:200]
            raise CannotRun(f"no credentials for a cluster in {where}: {reason}") from None
        cfg.retries = 1
        self.server = cfg.host
        self.client = client.ApiClient(cfg)

    def get(self, path: str, query: list[tuple[str, Any]] | None = None) -> tuple[int, Obj]:
        """One GET; the status and the JSON body. Unreachable, or credentials refused (401): CannotRun."""
        method, url, headers, _, _ = self.client.param_serialize(
            "GET", path, query_params=query or [], header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        try:
            resp = self.client.call_api(method, url, headers, _request_timeout=TIMEOUT)
            resp.read()
        except urllib3.exceptions.HTTPError as err:
            reason = getattr(err, "reason", None) or err
            raise CannotRun(f"cannot reach the API server at {self.server}: {reason}") from None
        body: Any
        try:
            body = json.loads(resp.data) if resp.data else {}
        except ValueError:
            body = {}
        if resp.status == 401:
            raise CannotRun(f"the API server at {self.server} refused the credentials (401 Unauthorized): "
                            "log in again or check the kubeconfig")
        return resp.status, body if isinstance(body, dict) else {}

    def items(self, key: str) -> list[Obj]:
        """All objects of one list, page by page. A refusal is CannotRun: doctor needs every list."""
        out: list[Obj] = []
        token = ""
        while True:
            query: list[tuple[str, Any]] = [("limit", PAGE)]
            if key == "pods":
                query.append(("fieldSelector", UNFINISHED))
            if token:
                query.append(("continue", token))
            status, body = self.get(LISTS[key], query)
            if status == 403:
                raise CannotRun(f"no permission to list {WHAT[key]} in all namespaces ({_message(body)}); "
                                f"doctor needs get and list on {', '.join(WHAT.values())}")
            if status != 200:
                raise CannotRun(f"listing {WHAT[key]} failed with HTTP {status}: {_message(body)}")
            out.extend(i for i in body.get("items") or [] if isinstance(i, dict))
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return out

    def optional(self, path: str, what: str, cluster: Cluster) -> Obj | None:
        """One object doctor can do without: a refusal or absence is recorded in `cluster.unreadable`."""
        status, body = self.get(path)
        if status == 200:
            return body
        cluster.unreadable[what] = ("it does not exist" if status == 404 else
                                    "no permission to read it" if status == 403 else f"HTTP {status}")
        return None


def _message(body: Obj) -> str:
    return str(body.get("message") or body.get("reason") or "no message")[:200]


def probe(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bytes:
    """The certificate an endpoint presents in a TLS handshake, as PEM. Nothing is sent after it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the point is to see what is served, trusted or not
    try:
        ipaddress.ip_address(host)
        sni = None
    except ValueError:
        sni = host
    with socket.create_connection((host, port), timeout=timeout) as sock, \
            context.wrap_socket(sock, server_hostname=sni) as tls:
        der = tls.getpeercert(binary_form=True)
    if not der:
        raise OSError("no certificate presented")
    return ssl.DER_cert_to_PEM_cert(der).encode()


Probe = Callable[[str, int], bytes]


def read(api: Api, *, now: dt.datetime | None = None, probe: Probe = probe) -> Cluster:
    """Everything the checks look at, in one pass."""
    cluster = Cluster(now=now or dt.datetime.now(dt.UTC))
    for key in LISTS:
        setattr(cluster, key, api.items(key))
    status, version = api.get("/version")
    if status == 200:
        cluster.version = version
    hooks = [(kind, hook) for kind, _, hook in model.all_webhooks(cluster)]
    ours = model.registered(cluster)
    for _, _, hook in ours.values():
        svc = objects.mapping(objects.mapping(hook.get("clientConfig")).get("service"))
        named = (svc.get("namespace"), svc.get("name"))
        if svc and not any((objects.namespace_of(s), objects.name_of(s)) == named for s in cluster.services):
            found = api.optional(f"/api/v1/namespaces/{svc.get('namespace')}/services/{svc.get('name')}",
                                 f"Service {svc.get('namespace')}/{svc.get('name')}", cluster)
            if found is not None:
                cluster.services.append(found)
    for _, hook in hooks:
        if hook.get("name") == model.HAMI_WEBHOOK:
            ns, name = device_configmap(objects.mapping(hook.get("clientConfig")))
            found = api.optional(f"/api/v1/namespaces/{ns}/configmaps/{name}", f"ConfigMap {ns}/{name}",
                                 cluster)
            if found is not None:
                cluster.configmaps.append(found)
    for _, _, hook in ours.values():
        client_config = objects.mapping(hook.get("clientConfig"))
        key = model.endpoint(client_config)
        if key not in cluster.served:
            cluster.served[key] = _served(api, cluster, client_config, probe)
    _cert_manager(api, cluster)
    _audit_reports(api, cluster)
    return cluster


def _audit_reports(api: Api, cluster: Cluster) -> None:
    """The audit's own PolicyReports and ClusterPolicyReport, where their CRDs are installed and readable;
    otherwise why not (the checks then judge with the audit's findings themselves)."""
    selector = f"{reports.MANAGED[0]}={reports.MANAGED[1]}"
    for plural in ("policyreports", "clusterpolicyreports"):
        status, body = api.get(f"/apis/{reports.API_VERSION}/{plural}", [("labelSelector", selector)])
        if status != 200:
            cluster.reports, cluster.reports_state = [], (
                "the PolicyReport CRDs are not installed" if status == 404 else
                "no permission to list policyreports.wgpolicyk8s.io" if status == 403 else f"HTTP {status}")
            return
        cluster.reports.extend(i for i in body.get("items") or [] if isinstance(i, dict))


def _served(api: Api, cluster: Cluster, client_config: Mapping[str, Any], probe: Probe) -> Served:
    """What the endpoint serves: a handshake with it (a URL, or the Service's DNS name inside the cluster),
    else the certificate in the Secret that the Service's pods mount."""
    host, port = model.endpoint_host(client_config)
    try:
        return Served(pem=probe(host, port), source=f"served at {host}:{port}")
    except (OSError, ssl.SSLError) as err:
        reached = f"{host}:{port} is not reachable from here ({err.strerror or err})"
    if not objects.mapping(client_config.get("service")):
        return Served(error=reached)
    tried = []
    for deploy, name in serving.mounted_secrets(cluster, client_config):
        ns = objects.namespace_of(deploy)
        what = f"Secret {ns}/{name}"
        crt = objects.mapping((_secret(api, cluster, ns, name) or {}).get("data")).get("tls.crt")
        if crt:
            return Served(pem=base64.b64decode(crt),
                          source=f"in {what} (mounted by Deployment {objects.ref(deploy)})")
        tried.append(f"{what}: {cluster.unreadable.get(what, 'no tls.crt in it')}")
    if tried:
        return Served(error=f"{reached}; {'; '.join(tried)}")
    return Served(error=f"{reached}, and no Deployment behind the Service mounts a TLS Secret "
                        "doctor could read")


#: The Secret keys doctor keeps: the certificates, never the key.
SECRET_KEYS = ("tls.crt", "ca.crt")


def _secret(api: Api, cluster: Cluster, namespace: str, name: str) -> Obj | None:
    """A TLS Secret, once, where allowed: kept in `cluster.secrets` with its certificates only."""
    what = f"Secret {namespace}/{name}"
    found = serving.secret(cluster, namespace, name)
    if found is not None or what in cluster.unreadable:
        return found
    body = api.optional(f"/api/v1/namespaces/{namespace}/secrets/{name}", what, cluster)
    if body is None:
        return None
    meta = objects.metadata(body)
    kept: Obj = {"metadata": {"name": name, "namespace": namespace,
                              "annotations": dict(objects.mapping(meta.get("annotations")))},
                 "data": {k: v for k, v in objects.mapping(body.get("data")).items() if k in SECRET_KEYS}}
    cluster.secrets.append(kept)
    return kept


# --- cert-manager ----------------------------------------------------------------------------------------

CERT_MANAGER = "/apis/cert-manager.io/v1"


def _cert_manager(api: Api, cluster: Cluster) -> None:
    """Where the configurations ask cert-manager for their caBundle: the Certificates in their namespaces
    (or the one named, where listing is refused), the issuer of each serving Certificate, the CA Certificate
    of a CA Issuer (or its Secret, where no Certificate writes it), and the Secrets the pods mount. A
    cluster without cert-manager's API is recorded in `cluster.cert_manager`; a refusal is a note."""
    injected = cert_manager.injections(cluster)
    if not injected:
        return
    status, body = api.get(CERT_MANAGER)
    if status != 200:
        cluster.cert_manager = ("the API server serves no cert-manager.io/v1 (cert-manager's CRDs are not "
                                "installed)" if status == 404 else
                                f"reading cert-manager.io/v1 failed with HTTP {status}: {_message(body)}")
        return
    listed: set[str] = set()
    named = [(ns, name) for _, _, annotation, ns, name in injected if annotation == cert_manager.INJECT_CA_FROM]
    mounted = [(objects.namespace_of(deploy), name) for deploy, name in serving.serving_secrets(cluster)]
    for ns in dict.fromkeys(ns for ns, _ in [*named, *mounted] if ns):
        _certificates(api, cluster, ns, listed)
    for ns, name in named:
        if ns and ns not in listed and cert_manager.certificate(cluster, ns, name) is None:
            _custom(api, cluster, "Certificate", "certificates", ns, name, cluster.certificates)
    serving_certs = cert_manager.serving_certificates(cluster)
    written = {(objects.namespace_of(c), cert_manager.secret_name(c)) for c in serving_certs}
    for ns, name in [m for m in mounted if m in written] or mounted:  # the TLS Secret, not every mounted one
        _secret(api, cluster, ns, name)
    for cert in serving_certs:
        issued_by = cert_manager.issuer_ref(cert)
        if issued_by is None:
            continue
        signer = cert_manager.issuer(cluster, *issued_by)
        if signer is None:
            kind, ns, name = issued_by
            signer = _custom(api, cluster, kind, f"{kind.lower()}s", ns, name, cluster.issuers)
        held = cert_manager.ca_secret(signer) if signer is not None else None
        if held is None:
            continue
        _certificates(api, cluster, held[0], listed)
        if not cert_manager.writing(cluster, *held):
            _secret(api, cluster, *held)


def _certificates(api: Api, cluster: Cluster, namespace: str, listed: set[str]) -> None:
    """The Certificates of one namespace, once; a refusal is recorded as unreadable."""
    if namespace in listed or f"Certificates in namespace {namespace}" in cluster.unreadable:
        return
    status, body = api.get(f"{CERT_MANAGER}/namespaces/{namespace}/certificates", [("limit", PAGE)])
    if status != 200:
        cluster.unreadable[f"Certificates in namespace {namespace}"] = (
            "no permission to list them" if status == 403 else f"HTTP {status}: {_message(body)}")
        return
    listed.add(namespace)
    for item in body.get("items") or []:
        if isinstance(item, dict) and cert_manager.certificate(cluster, objects.namespace_of(item),
                                                               objects.name_of(item)) is None:
            cluster.certificates.append({**item, "kind": "Certificate"})


def _custom(api: Api, cluster: Cluster, kind: str, plural: str, namespace: str, name: str,
            into: list[Obj]) -> Obj | None:
    """One cert-manager object by name (a ClusterIssuer has no namespace), where allowed."""
    what = cert_manager.label(kind, namespace, name)
    if what in cluster.unreadable:
        return None
    where = f"/namespaces/{namespace}" if namespace else ""
    body = api.optional(f"{CERT_MANAGER}{where}/{plural}/{name}", what, cluster)
    if body is None:
        return None
    found = {**body, "kind": kind}
    into.append(found)
    return found
