"""This webhook's own registration: trust, matchConditions, failure policy, replicas and disruption budget."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from cryptography import x509

from ..audit.objects import mapping, name_of, namespace_of, ref, sequence
from ..audit.registrations import shipped_webhooks
from ..rules.config import Config
from ..rules.selectors import selector_matches
from .model import (
    Cluster,
    Finding,
    Settings,
    counted,
    endpoint,
    endpoint_host,
    registered,
    unique,
)
from .serving import bundle, common_name, deployments_behind, pod_labels, signs

# --- this webhook's registration -------------------------------------------------------------------------

_MISSING = {
    "/mutate-pods": ("slice pods are not mutated: they stay on default-scheduler, where the backstop "
                     "refuses them"),
    "/validate-pods": ("pods are not checked again after other mutating webhooks, nor kubectl debug on "
                       "slice pods"),
    "/validate-workloads": "workloads are not checked when they are applied, only their pods when created",
}


def registration(cluster: Cluster, settings: Settings) -> list[Finding]:
    """This webhook's configurations: present, failurePolicy and matchConditions as shipped, and a caBundle
    that verifies the certificate the endpoint actually serves, not about to expire."""
    ours = registered(cluster)
    found: list[Finding] = []
    endpoints: set[str] = set()
    for kind, config_name, shipped in shipped_webhooks():
        entry = ours.get(shipped["name"])
        if entry is None:
            path = str(mapping(mapping(shipped.get("clientConfig")).get("service")).get("path", ""))
            lost = _MISSING.get(path.removeprefix("/warn"), "it does not run")
            if path.startswith("/warn/"):  # the copy for namespaces in rollout mode (SPEC 4.10)
                lost = f"in namespaces labelled hami.io/enforcement: warn, {lost}"
            found.append(Finding("registration", f"{kind} {config_name}",
                                 f"webhook {shipped['name']} is not registered: {lost}"
                                 "; apply it (kubectl apply -f certs/webhook-configurations.yaml, "
                                 "or helm upgrade)"))
            continue
        _, doc, hook = entry
        where = f"{kind} {name_of(doc)}"
        policy, want = hook.get("failurePolicy", "Fail"), shipped.get("failurePolicy")
        if policy != want and want == "Fail":
            found.append(Finding("registration", where,
                                 f"webhook {hook['name']} has failurePolicy {policy}: while it is "
                                 "unreachable slice pods are admitted unmutated, on default-scheduler and "
                                 "outside HAMi's accounting; set failurePolicy: Fail (docs/operating.md)"))
        elif policy != want:
            found.append(Finding("registration", where,
                                 f"webhook {hook['name']} has failurePolicy {policy}: an outage of the "
                                 "webhook then blocks every rollout and the ReplicaSets and Jobs that "
                                 f"controllers create; set failurePolicy: {want} (its pods are checked "
                                 "again when created)"))
        found.extend(_match_conditions(where, hook, settings.config))
        found.extend(_trust(where, hook, cluster, settings, endpoints))
    return unique(found)


def _match_conditions(where: str, hook: Mapping[str, Any], config: Config) -> list[Finding]:
    conditions = [mapping(c) for c in sequence(hook.get("matchConditions"))]
    if not conditions:
        return [Finding("registration", where,
                        f"webhook {hook.get('name')} has no matchConditions: every object of its kinds, not "
                        "only those naming a slice resource, is sent to the webhook, so an outage blocks "
                        "them all; restore the shipped matchConditions")]
    text = " ".join(str(c.get("expression", "")) for c in conditions)
    missing = [name for name in config.slices if f"'{name}'" not in text and f'"{name}"' not in text]
    if missing:
        return [Finding("registration", where,
                        f"the matchConditions of webhook {hook.get('name')} do not name "
                        f"{', '.join(missing)}: objects asking only for it are never sent to the webhook; "
                        "name every slice resource the webhook is configured with (docs/operating.md)")]
    return []


def _names_host(cert: x509.Certificate, host: str) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        return ipaddress.ip_address(host) in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        pass
    for name in san.get_values_for_type(x509.DNSName):
        if name == host or (name.startswith("*.") and host.partition(".")[2] == name[2:]):
            return True
    return False


def _trust(where: str, hook: Mapping[str, Any], cluster: Cluster, settings: Settings,
           seen: set[str]) -> list[Finding]:
    """The caBundle of one webhook against what its endpoint serves; the served certificate's name and
    lifetime once per endpoint (the three webhooks usually share one), under the endpoint's name."""
    client_config = mapping(hook.get("clientConfig"))
    key = endpoint(client_config)
    cas = bundle(hook)
    if not cas:
        return [Finding("registration", where,
                        f"webhook {hook.get('name')} has no readable caBundle: the API server cannot verify "
                        f"{key} and refuses every call; apply certs/webhook-configurations.yaml again (or "
                        "check cert-manager's CA injection)")]
    first = key not in seen
    seen.add(key)
    served = cluster.served.get(key)
    leaf = None
    if served is not None and served.pem is not None:
        try:
            leaf = x509.load_pem_x509_certificates(served.pem)[0]
        except (ValueError, IndexError):
            leaf = None
    if served is None or leaf is None:
        why = ((served.error or f"{served.source} holds no PEM certificate") if served is not None
               else "not read")
        return [Finding("registration", f"endpoint {key}",
                        f"the certificate it serves could not be read ({why}): caBundle and expiry not "
                        "checked; run doctor where the endpoint is reachable (in the cluster), or with "
                        "permission to read the webhook's TLS Secret", action=False)] if first else []
    found = []
    signers = [ca for ca in cas if signs(ca, leaf)]
    if not signers:
        found.append(Finding("registration", where,
                             f"the caBundle of webhook {hook.get('name')} (CA "
                             f"{', '.join(common_name(c) for c in cas)}) does not sign the certificate "
                             f"{served.source} (issued by {leaf.issuer.rfc4514_string()}): the API server "
                             "refuses every call (x509: certificate signed by unknown authority); apply the "
                             "configurations with the CA that issued the serving certificate "
                             "(hami-mt-webhook certs writes them)"))
    if not first:
        return found
    at = f"endpoint {key}"
    host, _ = endpoint_host(client_config)
    if host and not _names_host(leaf, host):
        found.append(Finding("registration", at,
                             f"the certificate {served.source} does not name {host}: the API server refuses "
                             "it; issue it again for that name "
                             "(hami-mt-webhook certs --rotate --force --san ...)"))
    for cert, what in [(leaf, f"the serving certificate ({served.source})"),
                       *((ca, f"the CA {common_name(ca)}") for ca in signers)]:
        ends = cert.not_valid_after_utc
        if ends <= cluster.now:
            found.append(Finding("registration", at,
                                 f"{what} expired on {ends:%Y-%m-%d %H:%M} UTC: every call fails; rotate it "
                                 "(hami-mt-webhook certs --rotate --force, or check cert-manager) "
                                 "(docs/operating.md#certificates)"))
        elif ends - cluster.now < settings.expiry_warning:
            days = (ends - cluster.now).days
            found.append(Finding("registration", at,
                                 f"{what} expires on {ends:%Y-%m-%d %H:%M} UTC, in {counted(days, 'day')}: "
                                 "rotate it now (hami-mt-webhook certs --rotate, or check cert-manager's "
                                 "renewal) (docs/operating.md#certificates)"))
    return found


def availability(cluster: Cluster, settings: Settings) -> list[Finding]:
    """The replicas behind the Service the webhooks call: ready, more than one, kept by a PodDisruptionBudget.
    A webhook called by URL (a local process, an external endpoint) has no replicas doctor can see."""
    found = []
    seen = set()
    for _, (kind, doc, hook) in sorted(registered(cluster).items()):
        svc_ref = mapping(mapping(hook.get("clientConfig")).get("service"))
        if not svc_ref:
            continue
        ns, name = str(svc_ref.get("namespace", "")), str(svc_ref.get("name", ""))
        if (ns, name) in seen:
            continue
        seen.add((ns, name))
        service = next((s for s in cluster.services if namespace_of(s) == ns and name_of(s) == name), None)
        if service is None:
            why = cluster.unreadable.get(f"Service {ns}/{name}", "it does not exist")
            found.append(Finding("availability", f"Service {ns}/{name}",
                                 f"{kind} {name_of(doc)} calls this Service, which could not be read "
                                 f"({why}): every call fails; apply manifests/service.yaml (or helm upgrade)",
                                 action=why == "it does not exist"))
            continue
        behind = deployments_behind(service, cluster.deployments)
        if not behind:
            found.append(Finding("availability", f"Service {ns}/{name}",
                                 "no Deployment runs the pods this Service selects: every call fails; apply "
                                 "manifests/deployment.yaml (or helm upgrade)"))
            continue
        for deploy in behind:
            found.extend(_replicas(deploy, cluster))
    return found


def _replicas(deploy: Mapping[str, Any], cluster: Cluster) -> list[Finding]:
    where = f"Deployment {ref(deploy)}"
    want = mapping(deploy.get("spec")).get("replicas", 1)
    ready = mapping(deploy.get("status")).get("readyReplicas") or 0
    found = []
    if ready < want:
        found.append(Finding("availability", where,
                             f"{ready} of {want} replicas ready"
                             + (": no replica answers, so every slice pod is refused" if not ready else "")
                             + f"; see kubectl -n {namespace_of(deploy)} describe deployment "
                               f"{name_of(deploy)}, and the events and logs of its pods"))
    if want < 2:
        found.append(Finding("availability", where,
                             f"runs {counted(want, 'replica')}: a drain or a crash refuses every slice pod "
                             "(failurePolicy Fail); run 3, as shipped (docs/operating.md#availability)"))
    pdbs = [p for p in cluster.pdbs if namespace_of(p) == namespace_of(deploy)
            and selector_matches(mapping(p.get("spec")).get("selector"), pod_labels(deploy))
            and mapping(mapping(p.get("spec")).get("selector"))]
    if not pdbs:
        found.append(Finding("availability", where,
                             "no PodDisruptionBudget covers its pods: a node drain may evict every replica "
                             "at once; apply manifests/pdb.yaml (minAvailable: 1)"))
    for pdb in pdbs:
        spec = mapping(pdb.get("spec"))
        min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
        loose = (min_available in (0, "0", "0%") or max_unavailable == "100%"
                 or (isinstance(max_unavailable, int) and max_unavailable >= want))
        if loose:
            found.append(Finding("availability", f"PodDisruptionBudget {ref(pdb)}",
                                 f"lets a drain evict every replica of {where} (minAvailable "
                                 f"{min_available}, maxUnavailable {max_unavailable}); set minAvailable: 1"))
    return found
