"""Reading a cluster for the doctor: the API server's objects, and the certificate the webhook serves.

This is the doctor's only I/O, and it only reads (GET). The objects it needs everywhere are listed
cluster-wide (nodes, namespaces, pods not yet finished, Deployments, PodDisruptionBudgets,
ResourceQuotas, webhook configurations); without permission for one of them doctor cannot run. A few
it reads where allowed (the Services the webhooks call, HAMi's device ConfigMap, the webhook's TLS
Secret): a refusal there becomes a note, not a failure.
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

from . import model
from .components import device_configmap
from .model import Cluster, Obj, Served
from .registration import deployments_behind

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
        svc = model.mapping(model.mapping(hook.get("clientConfig")).get("service"))
        named = (svc.get("namespace"), svc.get("name"))
        if svc and not any((model.namespace_of(s), model.name_of(s)) == named for s in cluster.services):
            found = api.optional(f"/api/v1/namespaces/{svc.get('namespace')}/services/{svc.get('name')}",
                                 f"Service {svc.get('namespace')}/{svc.get('name')}", cluster)
            if found is not None:
                cluster.services.append(found)
    for _, hook in hooks:
        if hook.get("name") == model.HAMI_WEBHOOK:
            ns, name = device_configmap(model.mapping(hook.get("clientConfig")))
            found = api.optional(f"/api/v1/namespaces/{ns}/configmaps/{name}", f"ConfigMap {ns}/{name}",
                                 cluster)
            if found is not None:
                cluster.configmaps.append(found)
    for _, _, hook in ours.values():
        client_config = model.mapping(hook.get("clientConfig"))
        key = model.endpoint(client_config)
        if key not in cluster.served:
            cluster.served[key] = _served(api, cluster, client_config, probe)
    return cluster


def _served(api: Api, cluster: Cluster, client_config: Mapping[str, Any], probe: Probe) -> Served:
    """What the endpoint serves: a handshake with it (a URL, or the Service's DNS name inside the cluster),
    else the certificate in the Secret that the Service's pods mount."""
    host, port = model.endpoint_host(client_config)
    try:
        return Served(pem=probe(host, port), source=f"served at {host}:{port}")
    except (OSError, ssl.SSLError) as err:
        reached = f"{host}:{port} is not reachable from here ({err.strerror or err})"
    svc = model.mapping(client_config.get("service"))
    if not svc:
        return Served(error=reached)
    service = next((s for s in cluster.services if model.namespace_of(s) == svc.get("namespace")
                    and model.name_of(s) == svc.get("name")), None)
    for deploy in deployments_behind(service, cluster.deployments) if service else []:
        spec = model.mapping(model.mapping(model.mapping(deploy.get("spec")).get("template")).get("spec"))
        for volume in model.sequence(spec.get("volumes")):
            secret = model.mapping(model.mapping(volume).get("secret")).get("secretName")
            if not secret:
                continue
            ns = model.namespace_of(deploy)
            what = f"Secret {ns}/{secret}"
            body = api.optional(f"/api/v1/namespaces/{ns}/secrets/{secret}", what, cluster)
            crt = model.mapping((body or {}).get("data")).get("tls.crt")
            if crt:
                return Served(pem=base64.b64decode(crt),
                              source=f"in {what} (mounted by Deployment {model.ref(deploy)})")
            return Served(error=f"{reached}; {what}: {cluster.unreadable.get(what, 'no tls.crt in it')}")
    return Served(error=f"{reached}, and no Deployment behind the Service mounts a TLS Secret "
                        "doctor could read")
