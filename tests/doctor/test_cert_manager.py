"""The cert-manager check over plain objects, and what fetch reads for it from a stand-in API server.

The install is the chart's with `certManager.enabled=true`: a self-signed Issuer makes the root CA
Certificate, a CA Issuer signs the serving Certificate with it, and the configurations carry
`cert-manager.io/inject-ca-from`. The certificates are real (cryptography): a root CA, a leaf it signed,
and another CA.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
from typing import Any

import pytest

from hami_mt_webhook.doctor import cert_manager, fetch
from hami_mt_webhook.doctor.checks import Cluster, Finding, Settings
from hami_mt_webhook.doctor.model import Served
from hami_mt_webhook.service import certs

from .test_checks import NOW, NS, clean, found, registered

NAME = "hami-mt-webhook"
TLS = "hami-mt-webhook-tls"
ROOT_SECRET = f"{NAME}-root"
ROOT = certs.new_ca("hami-mt-webhook-root")
LEAF = certs.issue(ROOT, NAME, dns=certs.service_names(NAME, NS), days=90)
OTHER = certs.new_ca("another-ca")
LEAF_OF_OTHER = certs.issue(OTHER, NAME, dns=certs.service_names(NAME, NS), days=90)
INJECT = "cert-manager.io/inject-ca-from"


def stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def b64(pem: bytes) -> str:
    return base64.b64encode(pem).decode()


def certificate(name: str, secret: str, issuer: str, *, ready: str | None = "True", reason: str = "Ready",
                message: str = "Certificate is up to date and has not expired", not_after: dt.timedelta,
                renewal: dt.timedelta, is_ca: bool = False) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready, "reason": reason,
                                           "message": message}]
    return {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"secretName": secret, "isCA": is_ca, "issuerRef": {"kind": "Issuer", "name": issuer}},
            "status": {"conditions": conditions, "notAfter": stamp(NOW + not_after),
                       "renewalTime": stamp(NOW + renewal)}}


def issuer(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def tls_secret(name: str, leaf: certs.KeyPair, ca: certs.KeyPair | None) -> dict[str, Any]:
    data = {"tls.crt": b64(leaf.cert_pem())}
    if ca is not None:
        data["ca.crt"] = b64(ca.cert_pem())
    return {"metadata": {"name": name, "namespace": NS}, "data": data}


def installed() -> Cluster:
    """The chart with cert-manager, everything current: the caBundle holds the root that signed the leaf."""
    cluster = clean()
    cluster.mutating, cluster.validating = registered(ca_pem=ROOT.cert_pem())
    for doc in configurations(cluster):
        doc["metadata"]["annotations"] = {INJECT: f"{NS}/{NAME}"}
    cluster.deployments[0]["spec"]["template"]["spec"] = {
        "volumes": [{"name": "tls", "secret": {"secretName": TLS}},
                    {"name": "other", "secret": {"secretName": "unrelated"}}]}
    cluster.served = {k: Served(pem=LEAF.cert_pem(), source="served") for k in cluster.served}
    cluster.certificates = [
        certificate(NAME, TLS, f"{NAME}-ca", not_after=dt.timedelta(days=90), renewal=dt.timedelta(days=60)),
        certificate(f"{NAME}-root", ROOT_SECRET, f"{NAME}-selfsigned", is_ca=True,
                    not_after=dt.timedelta(days=3650), renewal=dt.timedelta(days=2430))]
    cluster.issuers = [issuer(f"{NAME}-selfsigned", {"selfSigned": {}}),
                       issuer(f"{NAME}-ca", {"ca": {"secretName": ROOT_SECRET}})]
    cluster.secrets = [tls_secret(TLS, LEAF, ROOT)]
    return cluster


def configurations(cluster: Cluster) -> list[dict[str, Any]]:
    return [*cluster.mutating, *cluster.validating]


def cm(cluster: Cluster, settings: Settings | None = None) -> tuple[list[Finding], list[Finding]]:
    """The cert-manager check's findings to act on, and its notes; every other check must stay quiet."""
    out = found(cluster, settings)
    assert [f.line() for f in out if f.check != "cert-manager"] == []
    return [f for f in out if f.action], [f for f in out if not f.action]


def test_a_current_install_says_when_each_certificate_expires_and_renews():
    actions, notes = cm(installed())
    assert actions == []
    assert [(f.object, f.message) for f in notes] == [
        (f"Certificate {NS}/{NAME}",
         f"the serving certificate, in Secret {NS}/{TLS}, issued by Issuer {NS}/{NAME}-ca: expires "
         f"{NOW + dt.timedelta(days=90):%Y-%m-%d %H:%M} UTC, next renewal "
         f"{NOW + dt.timedelta(days=60):%Y-%m-%d %H:%M} UTC"),
        (f"Certificate {NS}/{NAME}-root",
         f"the CA certificate, in Secret {NS}/{ROOT_SECRET}, issued by Issuer {NS}/{NAME}-selfsigned: expires "
         f"{NOW + dt.timedelta(days=3650):%Y-%m-%d %H:%M} UTC, next renewal "
         f"{NOW + dt.timedelta(days=2430):%Y-%m-%d %H:%M} UTC")]


def test_without_the_annotation_cert_manager_is_not_looked_at():
    cluster = installed()
    for doc in configurations(cluster):
        doc["metadata"].pop("annotations")
    assert found(cluster, check="cert-manager") == []


def test_inject_ca_from_secret_also_means_cert_manager():
    cluster = installed()
    for doc in configurations(cluster):
        doc["metadata"]["annotations"] = {"cert-manager.io/inject-ca-from-secret": f"{NS}/{TLS}"}
    actions, notes = cm(cluster)
    assert actions == [] and len(notes) == 2  # the serving Certificate found by the Secret the pods mount


def test_without_cert_managers_crds_one_note_and_nothing_else():
    cluster = installed()
    cluster.certificates, cluster.issuers = [], []
    cluster.cert_manager = "the API server serves no cert-manager.io/v1 (cert-manager's CRDs are not installed)"
    actions, notes = cm(cluster)
    assert actions == [] and len(notes) == 1
    assert notes[0].object == f"MutatingWebhookConfiguration {NAME}"
    assert f"carries {INJECT}: {NS}/{NAME}, but the API server serves no cert-manager.io/v1" in notes[0].message


@pytest.mark.parametrize(("ready", "said"), [
    ("False", "Ready False, Failed: The certificate request has failed to complete and will be retried"),
    ("Unknown", "Ready Unknown, Failed: The certificate request has failed to complete and will be retried"),
    (None, "no Ready condition yet"),
])
def test_a_serving_certificate_not_ready(ready, said):
    cluster = installed()
    cluster.certificates[0] = certificate(
        NAME, TLS, f"{NAME}-ca", ready=ready, reason="Failed",
        message="The certificate request has failed to complete and will be retried",
        not_after=dt.timedelta(days=90), renewal=dt.timedelta(days=60))
    actions, _ = cm(cluster)
    assert [(f.object, f.message) for f in actions] == [
        (f"Certificate {NS}/{NAME}",
         f"the serving certificate is not Ready ({said}): cert-manager has not issued it, so Secret {NS}/{TLS} "
         f"keeps an older certificate or none; see kubectl -n {NS} describe certificate {NAME} (and its "
         "CertificateRequest's events) and cert-manager's logs (kubectl -n cert-manager logs deploy/cert-manager)")]


def test_a_renewal_past_due_means_cert_manager_is_not_renewing():
    cluster = installed()
    cluster.certificates[0]["status"]["renewalTime"] = stamp(NOW - dt.timedelta(hours=5))
    actions, _ = cm(cluster)
    assert len(actions) == 1 and actions[0].object == f"Certificate {NS}/{NAME}"
    assert actions[0].message.startswith(
        f"the serving certificate was due for renewal at {NOW - dt.timedelta(hours=5):%Y-%m-%d %H:%M} UTC, "
        "5 hours ago, and cert-manager has not renewed it")
    assert "is cert-manager's controller running (kubectl -n cert-manager get deploy cert-manager)?" in \
        actions[0].message


def test_a_renewal_just_due_is_given_a_few_minutes():
    cluster = installed()
    cluster.certificates[0]["status"]["renewalTime"] = stamp(NOW - dt.timedelta(minutes=3))
    assert cm(cluster)[0] == []
    assert len(cm(cluster, Settings(renewal_overdue=dt.timedelta(minutes=1)))[0]) == 1


def test_a_ca_bundle_that_does_not_sign_what_cert_manager_wrote_names_each_configuration():
    """cert-manager renewed the leaf from another CA; the replicas still serve the old one (registration is
    quiet), and only one configuration holds the new CA (beside the old one): the others refuse it soon."""
    cluster = installed()
    cluster.secrets = [tls_secret(TLS, LEAF_OF_OTHER, OTHER)]
    updated = cluster.validating[0]
    for hook in updated["webhooks"]:
        hook["clientConfig"]["caBundle"] = b64(OTHER.cert_pem() + ROOT.cert_pem())
    actions, _ = cm(cluster)
    names = {f"{d['kind']} {d['metadata']['name']}" for d in configurations(cluster) if d is not updated}
    assert {f.object for f in actions} == names and len(actions) == len(names)
    message = next(f.message for f in actions if f.object == f"MutatingWebhookConfiguration {NAME}")
    assert message.startswith(
        f"the caBundle of mutate.hami-mt.mthreads.com (CA hami-mt-webhook-root) does not sign the certificate "
        f"cert-manager wrote to Secret {NS}/{TLS} (issued by CN=another-ca at ")
    assert ("the API server refuses every call once the replicas load it (within about a minute); cert-manager's "
            "CA injector has not put the current CA in it: check that cainjector runs (kubectl -n cert-manager "
            "get deploy cert-manager-cainjector) and its logs, and that cert-manager.io/inject-ca-from: "
            f"{NS}/{NAME} names what writes Secret {NS}/{TLS}") in message


def test_a_secret_whose_own_ca_does_not_sign_it_says_injection_will_not_help():
    cluster = installed()
    cluster.secrets = [tls_secret(TLS, LEAF_OF_OTHER, ROOT)]
    actions, _ = cm(cluster)
    assert actions and all("the Secret's own ca.crt (hami-mt-webhook-root) does not sign its tls.crt either"
                           in f.message for f in actions)


def test_a_ca_bundle_matching_the_secret_is_quiet_even_with_an_extra_ca():
    cluster = installed()
    for doc in configurations(cluster):
        for hook in doc["webhooks"]:
            hook["clientConfig"]["caBundle"] = b64(OTHER.cert_pem() + ROOT.cert_pem())
    assert cm(cluster)[0] == []


def test_an_annotation_naming_a_missing_certificate():
    cluster = installed()
    cluster.mutating[0]["metadata"]["annotations"] = {INJECT: f"{NS}/gone"}
    actions, _ = cm(cluster)
    assert [(f.object, f.message) for f in actions] == [
        (f"MutatingWebhookConfiguration {NAME}",
         f"{INJECT} names Certificate {NS}/gone, which could not be read (it does not exist): cainjector injects "
         "nothing, so the caBundle stays as it is while the serving certificate is renewed; point the annotation "
         "at the Certificate that writes the webhook's TLS Secret")]


def test_an_annotation_naming_the_root_is_fine_while_its_ca_signs_the_leaf():
    cluster = installed()
    cluster.validating[0]["metadata"]["annotations"] = {INJECT: f"{NS}/{NAME}-root"}
    assert cm(cluster)[0] == []


def test_an_annotation_pointing_elsewhere_is_named_as_the_cause():
    cluster = installed()
    elsewhere = tls_secret("elsewhere-tls", certs.issue(OTHER, "x"), OTHER)
    cluster.certificates.append(certificate("elsewhere", "elsewhere-tls", f"{NAME}-ca",
                                            not_after=dt.timedelta(days=90), renewal=dt.timedelta(days=60)))
    cluster.secrets.append(elsewhere)
    cluster.validating[0]["metadata"]["annotations"] = {INJECT: f"{NS}/elsewhere"}
    for hook in cluster.validating[0]["webhooks"]:
        hook["clientConfig"]["caBundle"] = b64(OTHER.cert_pem() + ROOT.cert_pem())  # still signs the served leaf
    cluster.secrets[0] = tls_secret(TLS, certs.issue(certs.new_ca("renewed-root"), NAME), None)
    actions, _ = cm(cluster)
    by_object = {f.object: f.message for f in actions}
    assert by_object[f"ValidatingWebhookConfiguration {NAME}"].endswith(
        f"{INJECT} names Certificate {NS}/elsewhere, which writes another Secret: point it at the Certificate "
        f"that writes Secret {NS}/{TLS}")
    assert "cainjector runs" in by_object[f"MutatingWebhookConfiguration {NAME}"]


def test_a_root_expiring_before_the_next_renewal_is_due_for_rotation():
    cluster = installed()
    cluster.certificates[1]["status"]["notAfter"] = stamp(NOW + dt.timedelta(days=70))
    actions, _ = cm(cluster)
    assert [(f.object, f.message) for f in actions] == [
        (f"Certificate {NS}/{NAME}-root",
         f"the CA certificate expires on {NOW + dt.timedelta(days=70):%Y-%m-%d %H:%M} UTC (in 69 days), "
         "less than 30 days after the serving certificate's next renewal (Certificate "
         f"{NS}/{NAME}, at {NOW + dt.timedelta(days=60):%Y-%m-%d %H:%M} UTC): a certificate issued from it "
         "cannot outlive it; rotate the root now, as docs/operating.md#rotating-the-root says")]
    cluster.certificates[1]["status"]["notAfter"] = stamp(NOW + dt.timedelta(days=91))
    assert cm(cluster)[0] == []


def test_a_root_certificate_not_ready_or_not_renewed():
    cluster = installed()
    root = cluster.certificates[1]
    root["status"]["conditions"][0].update(status="False", reason="Expired", message="expired")
    root["status"]["renewalTime"] = stamp(NOW - dt.timedelta(days=3))
    actions, _ = cm(cluster)
    assert [f.object for f in actions] == [f"Certificate {NS}/{NAME}-root"] * 2
    assert actions[0].message.startswith("the CA certificate is not Ready (Ready False, Expired: expired): "
                                         f"cert-manager has not issued it, so Issuer {NS}/{NAME}-ca cannot sign")
    assert "was due for renewal at" in actions[1].message and "3 days ago" in actions[1].message


def test_a_ca_no_certificate_writes_is_read_from_its_secret_where_allowed():
    cluster = installed()
    cluster.certificates.pop()  # the CA Secret made by hand
    short = certs.new_ca("hand-made-root", days=40)
    cluster.secrets.append(tls_secret(ROOT_SECRET, short, short))
    actions, _ = cm(cluster)
    assert [f.object for f in actions] == [f"Secret {NS}/{ROOT_SECRET}"]
    assert actions[0].message.startswith("the CA hand-made-root expires on")
    cluster.secrets.pop()
    cluster.unreadable[f"Secret {NS}/{ROOT_SECRET}"] = "no permission to read it"
    actions, notes = cm(cluster)
    assert actions == []
    assert (f"Secret {NS}/{ROOT_SECRET}",
            f"Issuer {NS}/{NAME}-ca signs with the CA in this Secret, which no Certificate doctor read writes and "
            "which could not be read (no permission to read it): the CA's expiry is not checked; allow get on "
            "this Secret, or list on certificates.cert-manager.io in its namespace") in \
        [(f.object, f.message) for f in notes]


def test_a_missing_issuer_acts_an_unreadable_one_notes():
    cluster = installed()
    cluster.issuers = [cluster.issuers[0]]
    actions, _ = cm(cluster)
    assert [f.object for f in actions] == [f"Certificate {NS}/{NAME}"]
    assert actions[0].message.startswith(f"is issued by Issuer {NS}/{NAME}-ca, which could not be read (it does "
                                         "not exist): cert-manager cannot issue or renew it")
    cluster.unreadable[f"Issuer {NS}/{NAME}-ca"] = "no permission to read it"
    assert cm(cluster)[0] == []


def test_an_unreadable_serving_secret_is_a_note():
    cluster = installed()
    cluster.secrets = []
    cluster.unreadable[f"Secret {NS}/{TLS}"] = "no permission to read it"
    actions, notes = cm(cluster)
    assert actions == []
    assert any(f.object == f"Secret {NS}/{TLS}" and f.message.startswith(
        "could not be read (no permission to read it): the caBundle was checked against the certificate the "
        "endpoint serves (registration)") for f in notes)


def test_cert_manager_objects_of_the_wrong_shape():
    cluster = installed()
    junk: list[Any] = [{}, {"metadata": None, "spec": None, "status": None},
                       {"metadata": {"name": NAME, "namespace": NS}, "spec": {"issuerRef": None},
                        "status": {"conditions": [None, "x"], "notAfter": "soon"}}]
    cluster.certificates[1:1] = copy.deepcopy(junk)
    cluster.issuers.extend(copy.deepcopy(junk))
    cluster.secrets.extend([*copy.deepcopy(junk), {"metadata": {"name": "x"}, "data": {"tls.crt": "not base64"}}])
    cm(cluster)  # no exception; the findings themselves are checked above


# --- fetch: what it asks the API server for -------------------------------------------------------------

class StandIn(fetch.Api):
    """An API server holding the objects of a Cluster, answering GETs by path; it remembers what was asked."""

    def __init__(self, cluster: Cluster, answers: dict[str, tuple[int, dict[str, Any]]]) -> None:
        self.server = "https://stand-in"
        self.asked: list[str] = []
        self.answers = {path: (200, {"items": getattr(cluster, key)}) for key, path in fetch.LISTS.items()}
        self.answers.update(answers)

    def get(self, path: str, query: list[tuple[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
        self.asked.append(path)
        return self.answers.get(path, (404, {"message": "not found"}))


def served(host: str, port: int) -> bytes:
    return LEAF.cert_pem()


CM = "/apis/cert-manager.io/v1"


def test_fetch_without_cert_managers_api_records_it_and_asks_nothing_more():
    api = StandIn(installed(), {f"/api/v1/namespaces/{NS}/services/{NAME}": (200, clean().services[0])})
    cluster = fetch.read(api, now=NOW, probe=served)
    assert cluster.cert_manager.startswith("the API server serves no cert-manager.io/v1")
    assert [p for p in api.asked if "cert-manager" in p or "secrets" in p] == [CM]
    assert [f.action for f in found(cluster, check="cert-manager")] == [False]


def test_fetch_reads_the_chain_and_keeps_no_key():
    source = installed()
    secret = tls_secret(TLS, LEAF, ROOT)
    secret["data"]["tls.key"] = b64(LEAF.key_pem())
    api = StandIn(source, {
        f"/api/v1/namespaces/{NS}/services/{NAME}": (200, source.services[0]),
        CM: (200, {"kind": "APIResourceList"}),
        f"{CM}/namespaces/{NS}/certificates": (200, {"items": source.certificates}),
        f"{CM}/namespaces/{NS}/issuers/{NAME}-ca": (200, source.issuers[1]),
        f"/api/v1/namespaces/{NS}/secrets/{TLS}": (200, secret),
    })
    cluster = fetch.read(api, now=NOW, probe=served)
    assert [c["metadata"]["name"] for c in cluster.certificates] == [NAME, f"{NAME}-root"]
    assert [i["metadata"]["name"] for i in cluster.issuers] == [f"{NAME}-ca"]
    assert cluster.secrets == [tls_secret(TLS, LEAF, ROOT) | {"metadata": {"name": TLS, "namespace": NS,
                                                                         "annotations": {}}}]
    assert cluster.unreadable == {}
    assert f"/api/v1/namespaces/{NS}/secrets/unrelated" not in api.asked  # no Certificate writes it
    assert f"/api/v1/namespaces/{NS}/secrets/{ROOT_SECRET}" not in api.asked  # a Certificate writes it
    actions = [f for f in found(cluster) if f.action]
    assert actions == []


def test_fetch_where_certificates_may_not_be_listed_reads_the_named_one():
    source = installed()
    api = StandIn(source, {
        f"/api/v1/namespaces/{NS}/services/{NAME}": (200, source.services[0]),
        CM: (200, {}),
        f"{CM}/namespaces/{NS}/certificates": (403, {"message": "forbidden"}),
        f"{CM}/namespaces/{NS}/certificates/{NAME}": (200, source.certificates[0]),
        f"{CM}/namespaces/{NS}/issuers/{NAME}-ca": (403, {"message": "forbidden"}),
        f"/api/v1/namespaces/{NS}/secrets/{TLS}": (200, tls_secret(TLS, LEAF, ROOT)),
    })
    cluster = fetch.read(api, now=NOW, probe=served)
    assert [c["metadata"]["name"] for c in cluster.certificates] == [NAME]
    out = found(cluster, check="cert-manager")
    assert all(not f.action for f in out), [f.line() for f in out]
    assert {f.object for f in out} == {f"namespace {NS}", f"Certificate {NS}/{NAME}"}
    assert f"/api/v1/namespaces/{NS}/secrets/unrelated" not in api.asked


def test_the_check_is_registered_after_registration():
    from hami_mt_webhook.doctor import checks

    names = [name for name, _ in checks.CHECKS]
    assert names.index("cert-manager") == names.index("registration") + 1
    assert dict(checks.CHECKS)["cert-manager"] is cert_manager.cert_manager


def unreachable(host: str, port: int) -> bytes:
    raise OSError(f"{host} does not resolve here")


def test_fetch_without_cert_manager_reads_the_served_certificate_from_the_mounted_secret():
    """No annotation: cert-manager's API is not asked; an endpoint out of reach falls back to the Secret."""
    source = installed()
    for doc in configurations(source):
        doc["metadata"].pop("annotations")
    service = (200, source.services[0])
    api = StandIn(source, {f"/api/v1/namespaces/{NS}/services/{NAME}": service,
                           f"/api/v1/namespaces/{NS}/secrets/{TLS}": (200, tls_secret(TLS, LEAF, ROOT))})
    cluster = fetch.read(api, now=NOW, probe=unreachable)
    (got,) = cluster.served.values()
    assert (got.pem, got.source) == (LEAF.cert_pem(), f"in Secret {NS}/{TLS} (mounted by Deployment {NS}/{NAME})")
    assert not [p for p in api.asked if p.startswith(CM)]
    api = StandIn(source, {f"/api/v1/namespaces/{NS}/services/{NAME}": service})
    (got,) = fetch.read(api, now=NOW, probe=unreachable).served.values()
    assert got.pem is None and got.error == (
        f"{NAME}.{NS}.svc:443 is not reachable from here ({NAME}.{NS}.svc does not resolve here); "
        f"Secret {NS}/{TLS}: it does not exist; Secret {NS}/unrelated: it does not exist")


def test_a_root_cert_manager_is_about_to_renew_alone_is_due_for_rotation():
    cluster = installed()
    cluster.certificates[1]["status"]["renewalTime"] = stamp(NOW + dt.timedelta(days=20))
    actions, _ = cm(cluster)
    assert [f.object for f in actions] == [f"Certificate {NS}/{NAME}-root"]
    assert actions[0].message.startswith(
        f"cert-manager renews this CA on {NOW + dt.timedelta(days=20):%Y-%m-%d %H:%M} UTC: renewed alone")
    assert "rotate the root before then, as docs/operating.md#rotating-the-root says" in actions[0].message


def test_a_root_renewed_alone_is_found_before_the_serving_renewal_is_refused():
    cluster = installed()
    new_root = certs.new_ca("hami-mt-webhook-root")
    cluster.secrets.append(tls_secret(ROOT_SECRET, new_root, new_root))
    actions, _ = cm(cluster)
    assert [f.object for f in actions] == [f"Secret {NS}/{ROOT_SECRET}"]
    assert "the root was renewed on its own" in actions[0].message
    assert "do steps 2 to 4 of the root's rotation now" in actions[0].message
    # step 2 done (both roots in every caBundle): nothing to say
    cluster.mutating, cluster.validating = registered(ca_pem=ROOT.cert_pem() + new_root.cert_pem())
    for doc in configurations(cluster):
        doc["metadata"]["annotations"] = {INJECT: f"{NS}/{NAME}"}
    assert cm(cluster)[0] == []
    # the old root in its Secret still signs the leaf: nothing to say either
    cluster = installed()
    cluster.secrets.append(tls_secret(ROOT_SECRET, ROOT, ROOT))
    assert cm(cluster)[0] == []
