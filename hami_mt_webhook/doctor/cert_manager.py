"""cert-manager's view of the webhook's certificate, where cert-manager issues it.

cert-manager is in use when this webhook's configurations ask its CA injector for their caBundle:
`cert-manager.io/inject-ca-from: <namespace>/<Certificate>` (the CA of the Secret that Certificate writes)
or `cert-manager.io/inject-ca-from-secret: <namespace>/<Secret>`. The serving Certificates are the one the
annotation names and any writing a Secret the webhook's pods mount; the CA Certificate is found along the
issuer chain: the Certificate's `spec.issuerRef`, that Issuer's `spec.ca.secretName`, the Certificate whose
`spec.secretName` it is. Nothing here is named after the chart: a renamed release is found the same way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ..audit.objects import Obj, mapping, metadata, name_of, namespace_of, ref, sequence
from .model import (
    Cluster,
    Finding,
    Settings,
    counted,
    few,
    registered,
    timestamp,
    unique,
)
from .serving import bundle, common_name, mounted_secrets, pem_certificates, secret, serving_secrets, signs

CHECK = "cert-manager"
GROUP = "cert-manager.io"
INJECT_CA_FROM = "cert-manager.io/inject-ca-from"
INJECT_CA_FROM_SECRET = "cert-manager.io/inject-ca-from-secret"
#: Where a ClusterIssuer's CA Secret lives: cert-manager's cluster resource namespace, unless installed
#: with another `--cluster-resource-namespace`.
CLUSTER_RESOURCE_NAMESPACE = "cert-manager"
LOGS = "kubectl -n cert-manager logs deploy/cert-manager"
ROTATION = "docs/operating.md#rotating-the-root"

Injection = tuple[str, Obj, str, str, str]  # kind, configuration, annotation, namespace, name


def label(kind: str, namespace: str, name: str) -> str:
    """How an object is named in findings, and its key in `Cluster.unreadable`."""
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


# --- what the configurations name, and the objects along the chain (fetch reads by these too) ------------

def injections(cluster: Cluster) -> list[Injection]:
    """This webhook's configurations that ask cert-manager's CA injector for their caBundle, each once."""
    seen: dict[tuple[str, str], Injection] = {}
    for kind, doc, _ in registered(cluster).values():
        annotations = mapping(metadata(doc).get("annotations"))
        for annotation in (INJECT_CA_FROM, INJECT_CA_FROM_SECRET):
            value = annotations.get(annotation)
            if isinstance(value, str) and value and (kind, name_of(doc)) not in seen:
                namespace, _, name = value.rpartition("/")
                seen[(kind, name_of(doc))] = (kind, doc, annotation, namespace, name)
    return list(seen.values())


def certificate(cluster: Cluster, namespace: str, name: str) -> Obj | None:
    return next((c for c in cluster.certificates if namespace_of(c) == namespace and name_of(c) == name), None)


def secret_name(cert: Mapping[str, Any]) -> str:
    return str(mapping(cert.get("spec")).get("secretName") or "")


def writing(cluster: Cluster, namespace: str, name: str) -> list[Obj]:
    """The Certificates that write Secret `namespace/name`."""
    return [c for c in cluster.certificates if namespace_of(c) == namespace and secret_name(c) == name]


def serving_certificates(cluster: Cluster) -> list[Obj]:
    """The Certificates writing a Secret the webhook's pods mount; where no such Certificate was found (a
    webhook called by URL, a Deployment doctor did not see), those the annotations name."""
    found = [c for deploy, name in serving_secrets(cluster) for c in writing(cluster, namespace_of(deploy), name)]
    if not found:
        named = (certificate(cluster, ns, name) for _, _, annotation, ns, name in injections(cluster)
                 if annotation == INJECT_CA_FROM)
        found = [c for c in named if c is not None]
    return list({ref(c): c for c in found}.values())


def issuer_ref(cert: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of a Certificate's issuer; None for an external issuer (another API group)."""
    spec_ref = mapping(mapping(cert.get("spec")).get("issuerRef"))
    if (spec_ref.get("group") or GROUP) != GROUP or not spec_ref.get("name"):
        return None
    kind = str(spec_ref.get("kind") or "Issuer")
    return kind, namespace_of(cert) if kind == "Issuer" else "", str(spec_ref["name"])


def issuer(cluster: Cluster, kind: str, namespace: str, name: str) -> Obj | None:
    return next((i for i in cluster.issuers if i.get("kind") == kind and namespace_of(i) == namespace
                 and name_of(i) == name), None)


def ca_secret(issuer_obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the Secret a CA Issuer signs with; None for other issuers (self-signed, ACME)."""
    name = mapping(mapping(issuer_obj.get("spec")).get("ca")).get("secretName")
    if not name:
        return None
    namespace = namespace_of(issuer_obj) if issuer_obj.get("kind") == "Issuer" else CLUSTER_RESOURCE_NAMESPACE
    return namespace, str(name)


# --- the check ------------------------------------------------------------------------------------------

def cert_manager(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Where cert-manager issues the serving certificate: its Certificates Ready and renewed on time, the
    CA they are issued from outliving the next renewal, and every configuration's caBundle signing the
    certificate cert-manager last wrote (not only the one served now)."""
    injected = injections(cluster)
    if not injected:
        return []
    if cluster.cert_manager:
        kind, doc, annotation, namespace, name = injected[0]
        return [Finding(CHECK, f"{kind} {name_of(doc)}",
                        f"carries {annotation}: {namespace}/{name}, but {cluster.cert_manager}: cert-manager's "
                        "Certificates are not checked, and nothing renews the certificate or injects its CA; "
                        "install cert-manager, or drop the annotation and manage the certificate with "
                        "hami-mt-webhook certs", action=False)]
    found = [*_unlisted(cluster), *_targets(cluster, injected)]
    serving = serving_certificates(cluster)
    for cert in serving:
        found.extend(_state(cert, "the serving certificate",
                            f"Secret {namespace_of(cert)}/{secret_name(cert)} keeps an older certificate or none",
                            cluster, settings))
        found.extend(_chain(cert, cluster, settings))
    found.extend(_injected(cluster, injected, serving))
    return unique(found)


def _unlisted(cluster: Cluster) -> list[Finding]:
    return [Finding(CHECK, what.removeprefix("Certificates in "),
                    f"its Certificates could not be listed ({why}): only those the webhook configurations name "
                    "were checked; allow list on certificates.cert-manager.io there", action=False)
            for what, why in cluster.unreadable.items() if what.startswith("Certificates in ")]


def _targets(cluster: Cluster, injected: list[Injection]) -> list[Finding]:
    """The Certificate an inject-ca-from annotation names exists. (Whether its CA is the right one is for
    `_injected` to say: naming the CA's own Certificate is as good as naming the serving one.)"""
    found = []
    for kind, doc, annotation, namespace, name in injected:
        if annotation != INJECT_CA_FROM or certificate(cluster, namespace, name) is not None:
            continue
        why = cluster.unreadable.get(label("Certificate", namespace, name), "it does not exist")
        found.append(Finding(CHECK, f"{kind} {name_of(doc)}",
                             f"{annotation} names Certificate {namespace}/{name}, which could not be read ({why}): "
                             + ("cainjector injects nothing, so the caBundle stays as it is while the serving "
                                "certificate is renewed; point the annotation at the Certificate that writes the "
                                "webhook's TLS Secret" if why == "it does not exist" else
                                "its state is not checked; allow get on certificates.cert-manager.io in that "
                                "namespace"),
                             action=why == "it does not exist"))
    return found


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((mapping(c) for c in sequence(mapping(obj.get("status")).get("conditions"))
                 if mapping(c).get("type") == kind), None)


def _ago(delta: dt.timedelta) -> str:
    if delta >= dt.timedelta(days=2):
        return counted(delta.days, "day")
    if delta >= dt.timedelta(hours=2):
        return counted(int(delta.total_seconds() // 3600), "hour")
    return counted(int(delta.total_seconds() // 60), "minute")


def _at(when: dt.datetime | None) -> str:
    return f"{when:%Y-%m-%d %H:%M} UTC" if when is not None else "(not set)"


def _state(cert: Obj, role: str, consequence: str, cluster: Cluster, settings: Settings) -> list[Finding]:
    """A Certificate's Ready condition and renewal, and one note with its expiry and next renewal."""
    where = f"Certificate {ref(cert)}"
    describe = f"kubectl -n {namespace_of(cert)} describe certificate {name_of(cert)}"
    status = mapping(cert.get("status"))
    ends, renews = timestamp(status.get("notAfter")), timestamp(status.get("renewalTime"))
    found = []
    ready = _condition(cert, "Ready")
    if ready is None or ready.get("status") != "True":
        said = (f"Ready {ready.get('status', 'Unknown')}, {ready.get('reason') or 'no reason'}: "
                f"{ready.get('message') or 'no message'}" if ready is not None else "no Ready condition yet")
        found.append(Finding(CHECK, where,
                             f"{role} is not Ready ({said}): cert-manager has not issued it, so {consequence}; "
                             f"see {describe} (and its CertificateRequest's events) and cert-manager's logs "
                             f"({LOGS})"))
    if renews is not None and cluster.now - renews > settings.renewal_overdue:
        found.append(Finding(CHECK, where,
                             f"{role} was due for renewal at {_at(renews)}, {_ago(cluster.now - renews)} ago, and "
                             f"cert-manager has not renewed it (it expires at {_at(ends)}): is cert-manager's "
                             f"controller running (kubectl -n cert-manager get deploy cert-manager)? see "
                             f"{describe} and {LOGS}"))
    issued_by = issuer_ref(cert)
    found.append(Finding(CHECK, where,
                         f"{role}, in Secret {namespace_of(cert)}/{secret_name(cert)}"
                         + (f", issued by {label(*issued_by)}" if issued_by else "")
                         + f": expires {_at(ends)}, next renewal {_at(renews)}", action=False))
    return found


def _chain(cert: Obj, cluster: Cluster, settings: Settings) -> list[Finding]:
    """The issuer of a serving Certificate and, for a CA Issuer, the CA it signs with: its Certificate's
    state, and whether it lasts past the serving certificate's next renewal."""
    issued_by = issuer_ref(cert)
    if issued_by is None:  # an external issuer: nothing doctor knows how to read
        return []
    where = f"Certificate {ref(cert)}"
    signer = issuer(cluster, *issued_by)
    if signer is None:
        why = cluster.unreadable.get(label(*issued_by), "it does not exist")
        return [Finding(CHECK, where,
                        f"is issued by {label(*issued_by)}, which could not be read ({why}): "
                        + ("cert-manager cannot issue or renew it; create the issuer again (helm upgrade, or "
                           "apply manifests/components/cert-manager)" if why == "it does not exist" else
                           "the CA it signs with is not checked; allow get on issuers.cert-manager.io "
                           "(clusterissuers for a ClusterIssuer)"),
                        action=why == "it does not exist")]
    held = ca_secret(signer)
    if held is None:
        return []
    namespace, name = held
    due = timestamp(mapping(cert.get("status")).get("renewalTime")) or \
        timestamp(mapping(cert.get("status")).get("notAfter"))
    roots = writing(cluster, namespace, name)
    found = []
    for root in roots:
        found.extend(_state(root, "the CA certificate",
                            f"{label(*issued_by)} cannot sign the serving certificate with a current CA",
                            cluster, settings))
        ends = timestamp(mapping(root.get("status")).get("notAfter"))
        found.extend(_outlives(f"Certificate {ref(root)}", "the CA certificate", ends, cert, due, cluster,
                               settings))
        found.extend(_root_renewal(root, cert, cluster, settings))
    if roots:
        return found + _rotated_alone(cert, namespace, name, due, cluster)
    what = f"Secret {namespace}/{name}"
    held_secret = secret(cluster, namespace, name)
    cas = pem_certificates(mapping((held_secret or {}).get("data")).get("tls.crt"))
    if not cas:
        why = ("no certificate in its tls.crt" if held_secret is not None else
               cluster.unreadable.get(what, "not read"))
        return [Finding(CHECK, what,
                        f"{label(*issued_by)} signs with the CA in this Secret, which no Certificate doctor read "
                        f"writes and which could not be read ({why}): the CA's expiry is not checked; allow get "
                        "on this Secret, or list on certificates.cert-manager.io in its namespace",
                        action=False)]
    return _outlives(what, f"the CA {common_name(cas[0])}", cas[0].not_valid_after_utc, cert, due, cluster,
                     settings)


def _outlives(where: str, what: str, ends: dt.datetime | None, cert: Obj, due: dt.datetime | None,
              cluster: Cluster, settings: Settings) -> list[Finding]:
    """A CA ending before the serving certificate's next renewal plus the expiry margin: the root rotation
    is due."""
    if ends is None or due is None or ends >= max(due, cluster.now) + settings.expiry_warning:
        return []
    if ends <= cluster.now:
        return [Finding(CHECK, where,
                        f"{what} expired on {_at(ends)}: cert-manager cannot issue the serving certificate "
                        f"(Certificate {ref(cert)}) from it; rotate the root as {ROTATION} says")]
    return [Finding(CHECK, where,
                    f"{what} expires on {_at(ends)} (in {counted((ends - cluster.now).days, 'day')}), less "
                    f"than {counted(settings.expiry_warning.days, 'day')} after the serving certificate's next "
                    f"renewal (Certificate {ref(cert)}, at {_at(due)}): a certificate issued from it cannot "
                    f"outlive it; rotate the root now, as {ROTATION} says")]


def _injected(cluster: Cluster, injected: list[Injection], serving: list[Obj]) -> list[Finding]:
    """Each configuration's caBundle against the certificate cert-manager last wrote to the Secret the pods
    mount: after a renewal to another CA, the pods load it within a minute; a caBundle cainjector has not
    updated then refuses every call."""
    written = {(namespace_of(c), secret_name(c)) for c in serving}
    mounted = [(namespace_of(deploy), name) for deploy, name in serving_secrets(cluster)]
    tls = [m for m in mounted if m in written] or mounted
    found = []
    for namespace, name in tls:
        what = f"Secret {namespace}/{name}"
        held = secret(cluster, namespace, name)
        if held is None:
            why = cluster.unreadable.get(what, "not read")
            found.append(Finding(CHECK, what,
                                 f"could not be read ({why}): the caBundle was checked against the certificate "
                                 "the endpoint serves (registration), not the one cert-manager last wrote; allow "
                                 "get on this Secret to see a renewal the API server would refuse before the "
                                 "replicas load it", action=False))
            continue
        data = mapping(held.get("data"))
        leaves = pem_certificates(data.get("tls.crt"))
        if leaves:
            found.extend(_signed(cluster, injected, namespace, name, leaves[0], pem_certificates(data.get("ca.crt"))))
    return found


def _signed(cluster: Cluster, injected: list[Injection], namespace: str, name: str, leaf: x509.Certificate,
            cas: list[x509.Certificate]) -> list[Finding]:
    found = []
    for kind, doc, annotation, target_ns, target in injected:
        hooks = [h for h in sequence(doc.get("webhooks")) if isinstance(h, dict)
                 and any((namespace_of(d), s) == (namespace, name)
                         for d, s in mounted_secrets(cluster, mapping(h.get("clientConfig"))))]
        refused = [h for h in hooks if not any(signs(ca, leaf) for ca in bundle(h))]
        if not refused:
            continue
        held = ", ".join(common_name(c) for c in bundle(refused[0])) or "none"
        named = certificate(cluster, target_ns, target) if annotation == INJECT_CA_FROM else None
        if named is not None and (target_ns, secret_name(named)) != (namespace, name):
            fix = (f"{annotation} names Certificate {target_ns}/{target}, which writes another Secret: point it "
                   f"at the Certificate that writes Secret {namespace}/{name}")
        else:
            fix = ("cert-manager's CA injector has not put the current CA in it: check that cainjector runs "
                   "(kubectl -n cert-manager get deploy cert-manager-cainjector) and its logs, and that "
                   f"{annotation}: {target_ns}/{target} names what writes Secret {namespace}/{name}")
        if cas and not any(signs(ca, leaf) for ca in cas):
            fix += (f"; the Secret's own ca.crt ({', '.join(common_name(c) for c in cas)}) does not sign its "
                    "tls.crt either, so injecting it will not help: see the issuer's CA")
        found.append(Finding(CHECK, f"{kind} {name_of(doc)}",
                             f"the caBundle of {few([str(h.get('name')) for h in refused])} (CA {held}) does not "
                             f"sign the certificate cert-manager wrote to Secret {namespace}/{name} (issued by "
                             f"{leaf.issuer.rfc4514_string()} at {_at(leaf.not_valid_before_utc)}): the API "
                             "server refuses every call once the replicas load it (within about a minute); "
                             + fix))
    return found


def _root_renewal(root: Obj, cert: Obj, cluster: Cluster, settings: Settings) -> list[Finding]:
    """cert-manager renews the root by itself at its renewalTime; renewed alone, the next renewal of the serving
    certificate is signed by a CA the caBundle does not hold yet. Before that: rotate it by the order."""
    at = timestamp(mapping(root.get("status")).get("renewalTime"))
    if at is None or at <= cluster.now or at >= cluster.now + settings.expiry_warning:
        return []  # past: _state says it is overdue
    return [Finding(CHECK, f"Certificate {ref(root)}",
                    f"cert-manager renews this CA on {_at(at)}: renewed alone, the next renewal of the serving "
                    f"certificate (Certificate {ref(cert)}) is signed by a CA no caBundle holds yet and every "
                    f"call is refused until the replicas load it; rotate the root before then, as {ROTATION} "
                    "says")]


def _rotated_alone(cert: Obj, namespace: str, name: str, due: dt.datetime | None,
                   cluster: Cluster) -> list[Finding]:
    """The root in its Secret no longer signs the serving certificate and the caBundle lacks it: the root was
    renewed without the rest of the order, and the serving certificate's next renewal will be refused."""
    held = secret(cluster, namespace, name)
    cas = pem_certificates(mapping((held or {}).get("data")).get("tls.crt"))
    serving = secret(cluster, namespace_of(cert), secret_name(cert))
    leaves = pem_certificates(mapping((serving or {}).get("data")).get("tls.crt"))
    if not cas or not leaves or signs(cas[0], leaves[0]):
        return []
    trusted = [c for hook in _hooks(cluster) for c in bundle(hook)]
    if any(c.public_bytes(Encoding.DER) == cas[0].public_bytes(Encoding.DER) for c in trusted):
        return []  # mid-rotation, step 2 done: the new root is trusted already
    return [Finding(CHECK, f"Secret {namespace}/{name}",
                    f"holds a CA ({common_name(cas[0])}) that did not sign the serving certificate and that no "
                    f"caBundle holds: the root was renewed on its own; the serving certificate's next renewal "
                    f"(at {_at(due)}) will be refused by the API server until every replica loads it; do steps "
                    f"2 to 4 of the root's rotation now, as {ROTATION} says")]


def _hooks(cluster: Cluster) -> list[Mapping[str, Any]]:
    return [mapping(h) for doc in [*cluster.mutating, *cluster.validating] for h in doc.get("webhooks") or []]
