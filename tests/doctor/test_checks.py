"""Each doctor check over plain objects: a clean cluster gives nothing, each seeded problem its finding."""

from __future__ import annotations

import base64
import copy
import datetime as dt
from typing import Any

import pytest

from hami_mt_webhook.admission import configurations
from hami_mt_webhook.doctor import checks, components, model
from hami_mt_webhook.doctor.checks import Cluster, Settings
from hami_mt_webhook.doctor.model import Served
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.service import certs

NOW = dt.datetime.now(dt.UTC)
NS = "hami-mt-webhook"
HOST = f"hami-mt-webhook.{NS}.svc"
MEMORY, CORE, VGPU = "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/vgpu"
WHOLE = "mthreads.com/gpu"
PRODUCT = "mthreads.com/gpu.product"
CA = certs.new_ca()
SERVING = certs.issue(CA, "hami-mt-webhook", dns=certs.service_names("hami-mt-webhook", NS))


def node(name: str, cores: int | str, memory: int | str, *, whole: int = 0,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    capacity = {CORE: str(cores), MEMORY: str(memory)}
    if whole:
        capacity[WHOLE] = str(whole)
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"capacity": capacity}}


def pod(name: str, ns: str = "team", *, scheduler: str = "hami-scheduler", limits: dict | None = None,
        created: dt.datetime = NOW, conditions: list | None = None, owner: str | None = None,
        **spec: Any) -> dict[str, Any]:
    limits = {VGPU: "1", MEMORY: "32", CORE: "8"} if limits is None else limits
    stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    meta: dict[str, Any] = {"name": name, "namespace": ns, "creationTimestamp": stamp}
    if owner:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "controller": True}]
    return {"metadata": meta,
            "spec": {"schedulerName": scheduler,
                     "containers": [{"name": "c", "resources": {"limits": limits}}], **spec},
            "status": {"phase": "Pending", "conditions": conditions or []}}


def registered(url: str | None = None, ca_pem: bytes | None = None) -> tuple[list[dict], list[dict]]:
    """The shipped configurations as a cluster holds them: a caBundle, and a Service (or a URL)."""
    docs = configurations.with_ca_bundle(configurations.webhook_configurations(), ca_pem or CA.cert_pem())
    if url:
        for doc in docs:
            for hook in doc["webhooks"]:
                path = hook["clientConfig"].pop("service")["path"]
                hook["clientConfig"]["url"] = url + path
    return ([d for d in docs if d["kind"] == "MutatingWebhookConfiguration"],
            [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"])


def clean() -> Cluster:
    """An installed webhook with 3 ready replicas and a PDB, one S4000 and one S5000 node, nothing wrong."""
    mutating, validating = registered()
    labels = {"app.kubernetes.io/name": "hami-mt-webhook"}
    return Cluster(
        now=NOW,
        nodes=[node("s4000", 16, 96, labels={PRODUCT: "MTT-S4000"}),
               node("s5000", 128, 1280, labels={PRODUCT: "MTT-S5000"}),
               {"metadata": {"name": "whole"}, "status": {"capacity": {WHOLE: "8"}}}],
        namespaces=[{"metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}}}
                    for n in ("team", "kube-system", NS)],
        pods=[pod("running", nodeName="s5000"), pod("fresh")],
        deployments=[{"metadata": {"name": "hami-mt-webhook", "namespace": NS},
                      "spec": {"replicas": 3, "template": {"metadata": {"labels": labels}}},
                      "status": {"readyReplicas": 3}}],
        mutating=mutating, validating=validating,
        services=[{"metadata": {"name": "hami-mt-webhook", "namespace": NS}, "spec": {"selector": labels}}],
        pdbs=[{"metadata": {"name": "hami-mt-webhook", "namespace": NS},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}],
        quotas=[{"metadata": {"name": "gpu", "namespace": "team"},
                 "spec": {"hard": {f"requests.{MEMORY}": "256"}}}],
        served={f"service {NS}/hami-mt-webhook:443": Served(pem=SERVING.cert_pem(),
                                                            source=f"served at {HOST}:443")},
    )


def shipped(name: str | None = None, kind: str = "ValidatingWebhookConfiguration") -> list[dict]:
    """The webhooks this project ships (of the configuration `kind` `name`): one registration finding each."""
    return [hook for doc in configurations.webhook_configurations() for hook in doc["webhooks"]
            if name is None or (doc["metadata"]["name"], doc["kind"]) == (name, kind)]


def found(cluster: Cluster, settings: Settings | None = None,
          check: str | None = None) -> list[checks.Finding]:
    out = checks.run(cluster, settings or Settings())
    return [f for f in out if check is None or f.check == check]


def only(cluster: Cluster, check: str, settings: Settings | None = None) -> checks.Finding:
    """The one finding of the whole run, which must come from `check`."""
    out = found(cluster, settings)
    assert [f.check for f in out] == [check], [f.line() for f in out]
    return out[0]


def test_a_clean_cluster_gives_no_finding():
    assert found(clean()) == []


def test_a_finding_prints_as_one_line_and_as_json():
    f = checks.Finding("quota", "ResourceQuota a/b", "x is never enforced; add y")
    note = checks.Finding("registration", "X y", "could not read", action=False)
    assert f.line() == "quota: ResourceQuota a/b: x is never enforced; add y"
    assert note.line().startswith("note: registration: X y: ")
    assert f.as_json() == {"check": "quota", "severity": "action", "object": "ResourceQuota a/b",
                           "message": "x is never enforced; add y"}
    assert note.as_json()["severity"] == "note"


# --- vendor ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", model.VENDOR_COMPONENTS)
def test_a_vendor_deployment_in_any_namespace_is_found(name):
    cluster = clean()
    cluster.deployments.append({"metadata": {"name": name, "namespace": "mt-gpu-operator"},
                                "spec": {"replicas": 1}})
    f = only(cluster, "vendor")
    assert f.object == f"Deployment mt-gpu-operator/{name}"
    assert "runs" in f.message and "ClusterPolicy" in f.message


def test_a_vendor_deployment_scaled_to_zero_is_still_found():
    cluster = clean()
    cluster.deployments.append({"metadata": {"name": "mt-gpu-webhook", "namespace": "x"},
                                "spec": {"replicas": 0}})
    assert "scaled to 0" in only(cluster, "vendor").message


def test_a_vendor_webhook_configuration_is_found_by_name_or_by_the_service_it_calls():
    cluster = clean()
    cluster.mutating.append({"metadata": {"name": "mt-gpu-webhook"},
                             "webhooks": [{"name": "a.example.com", "clientConfig": {"url": "https://x/"}}]})
    service = {"namespace": "mt-gpu-operator", "name": "mt-gpu-webhook"}
    cluster.validating.append({"metadata": {"name": "renamed"},
                               "webhooks": [{"name": "b.example.com", "clientConfig": {"service": service}}]})
    out = found(cluster)
    assert [(f.check, f.object) for f in out] == [("vendor", "MutatingWebhookConfiguration mt-gpu-webhook"),
                                                  ("vendor", "ValidatingWebhookConfiguration renamed")]
    assert "kubectl delete validatingwebhookconfiguration renamed" in out[1].message


def test_other_deployments_of_similar_names_are_not_the_vendor():
    cluster = clean()
    cluster.deployments.append({"metadata": {"name": "mt-gpu-webhook-docs", "namespace": "x"}, "spec": {}})
    assert found(cluster) == []


# --- HAMi's own webhook ----------------------------------------------------------------------------------

def hami(cluster: Cluster, per_card: str | None) -> Cluster:
    service = {"namespace": "kube-system", "name": "hami-scheduler", "path": "/webhook"}
    cluster.mutating.append({"metadata": {"name": "hami-webhook"},
                             "webhooks": [{"name": "vgpu.hami.io", "clientConfig": {"service": service}}]})
    if per_card is not None:
        cluster.configmaps.append({"metadata": {"name": "hami-scheduler-device", "namespace": "kube-system"},
                                   "data": {"device-config.yaml": per_card}})
    return cluster


def test_hami_webhook_whose_memory_per_card_misses_a_reported_card_size():
    f = only(hami(clean(), "nvidia: {}\nmthreads:\n  memoryPerCard:\n    - 96\n"), "hami-webhook")
    assert f.object == "MutatingWebhookConfiguration hami-webhook" and f.action
    assert "memoryPerCard [96]" in f.message and "cards of 160 units" in f.message
    assert "devices.mthreads.memoryPerCard to [96, 160]" in f.message


def test_hami_webhook_without_memory_per_card_is_read_as_96():
    cluster = hami(clean(), "mthreads:\n  resourceCountName: x\n")
    assert "memoryPerCard [96]" in only(cluster, "hami-webhook").message


@pytest.mark.parametrize("text", ["mthreads:\n  memoryPerCard: [96, 160]\n",
                                  "mthreads:\n  memoryPerCard: [160, 96, 176]\n", "nvidia: {}\n",
                                  "not: [yaml", "",
                                  "mthreads:\n  memoryPerCard: []\n", "mthreads:\n  memoryPerCard: [x]\n"])
def test_hami_webhook_covering_every_card_size_or_not_managing_moore_threads_is_fine(text):
    assert found(hami(clean(), text)) == []


def test_hami_webhook_with_an_unreadable_configuration_is_a_note():
    cluster = hami(clean(), None)
    cluster.unreadable["ConfigMap kube-system/hami-scheduler-device"] = "no permission to read it"
    f = only(cluster, "hami-webhook")
    assert not f.action and "no permission to read it" in f.message and "96, 160" in f.message


#: What HAMi's chart registers by default (charts/hami/templates/scheduler/webhook.yaml): every pod CREATE.
HAMI_REACH: dict[str, Any] = {"rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                         "resources": ["pods"], "scope": "*"}],
              "namespaceSelector": {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn",
                                                          "values": ["ignore"]}]}}


def reaching(cluster: Cluster, **change) -> Cluster:
    """HAMi's webhook as its chart registers it, covering every card size: only the double mutation is left."""
    cluster = hami(cluster, "mthreads:\n  memoryPerCard: [96, 160]\n")
    cluster.mutating[-1]["webhooks"][0].update({**HAMI_REACH, **change})
    return cluster


def test_hami_webhook_registered_for_the_same_pods_is_a_double_mutation():
    f = only(reaching(clean()), "hami-webhook")
    assert f.action and f.object == "MutatingWebhookConfiguration hami-webhook"
    assert "registered for the same pods as this webhook (slice pods in team)" in f.message
    assert "--set scheduler.admissionWebhook.enabled=false" in f.message and "-n kube-system" in f.message


def test_hami_webhook_kept_away_from_the_slice_pods_namespaces_is_no_double_mutation():
    away = {"namespaceSelector": {"matchLabels": {"devices": "nvidia"}}}
    assert found(reaching(clean(), **away)) == []
    assert found(reaching(clean(), rules=[{**HAMI_REACH["rules"][0], "operations": ["UPDATE"]}])) == []


def test_a_double_mutation_needs_this_webhook_registered_too():
    cluster = reaching(clean())
    cluster.mutating = cluster.mutating[-1:]
    assert "hami-webhook" not in [f.check for f in found(cluster)]


def test_hami_memory_per_card_accepts_a_legacy_scalar():
    configmap = {"data": {"device-config.yaml": "mthreads:\n  memoryPerCard: 160\n"}}
    assert components.hami_memory_per_card(configmap) == [160]


# --- the scheduler ---------------------------------------------------------------------------------------

def test_pods_no_scheduler_looked_at_for_long_mean_nothing_answers():
    cluster = clean()
    old = NOW - dt.timedelta(minutes=6)
    cluster.pods += [pod("a", created=old), pod("b", created=old),
                     pod("young", created=NOW - dt.timedelta(minutes=1))]
    f = only(cluster, "scheduler")
    assert f.object == "scheduler hami-scheduler"
    assert f.message.startswith("2 pods have waited 5 minutes or more") and "team/a, team/b" in f.message


def test_pods_a_scheduler_has_tried_are_not_waiting_for_nothing():
    cluster = clean()
    old = NOW - dt.timedelta(hours=1)
    tried = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    cluster.pods += [pod("unschedulable", created=old, conditions=tried),
                     pod("bound", created=old, nodeName="s4000"),
                     pod("elsewhere", created=old, scheduler="volcano", limits={"cpu": "1"})]
    assert found(cluster) == []


def test_the_waiting_time_is_a_setting():
    cluster = clean()
    cluster.pods.append(pod("a", created=NOW - dt.timedelta(seconds=30)))
    assert found(cluster) == []
    assert "waited 0 minutes or more" in only(cluster, "scheduler", Settings(pending=dt.timedelta(0))).message


# --- nodes ---------------------------------------------------------------------------------------------

def test_an_overcommitted_card_is_named_with_its_ratio_and_both_fixes():
    cluster = clean()
    cluster.nodes.append(node("over", 128, 1408, labels={PRODUCT: "MTT-S5000"}))  # 176 a card
    cluster.nodes[1]["metadata"]["labels"][PRODUCT] = "MTT-S5000-old"  # keep the model label separating
    f = only(cluster, "capacity")
    assert f.object == "Node over" and "176 units" in f.message and "1.10 times a 160-unit card" in f.message
    assert "add 176 to --memory-per-card (chart: `memoryPerCard`)" in f.message
    assert "overcommit_ratio to 1.0" in f.message


def test_a_size_in_memory_per_card_is_known():
    cluster = clean()
    cluster.nodes = [node("over", 128, 1408)]
    assert found(cluster, Settings(config=Config(memory_per_card=(96, 160, 176)))) == []


@pytest.mark.parametrize(("cores", "memory", "words"), [
    (24, 96, "no sliced-card report"),       # not a multiple of 16
    (16, 1, "no sliced-card report"),        # below the smallest slice
    ("x", 96, "no sliced-card report"),      # unreadable
    (16, 40, "no card size"),                # 40 a card: neither a model nor 1-2 times one
    (16, 400, "no card size"),
])
def test_odd_reports_are_named(cores, memory, words):
    cluster = clean()
    cluster.nodes = [node("odd", cores, memory)]
    assert words in only(cluster, "capacity").message


def test_a_node_with_no_sliced_card_is_not_odd():
    cluster = clean()
    cluster.nodes.append(node("none", 0, 0))
    assert found(cluster) == []


def test_cards_reported_both_whole_and_sliced():
    cluster = clean()
    cluster.nodes[1] = node("s5000", 128, 1280, whole=8,
                            labels={PRODUCT: "MTT-S5000", "mthreads.com/gpu.count": "8"})
    f = only(cluster, "whole-and-sliced")
    assert f.object == "Node s5000"
    assert "8 whole cards (mthreads.com/gpu) and 8 sliced cards on a node of 8 cards" in f.message
    assert "run the webhook with --sliced-node-taint (chart: `slicedNodeTaint`)" in f.message


def test_whole_and_sliced_cards_that_fit_the_card_count_or_a_tolerated_taint_are_fine():
    taint = ("example.com/sliced", "true", "NoSchedule")
    fits = clean()
    fits.nodes[1] = node("s5000", 64, 640, whole=4, labels={PRODUCT: "MTT-S5000", "mthreads.com/gpu.count": "8"})
    assert found(fits) == []
    tainted = clean()
    tainted.nodes[0] = node("s4000", 16, 96, whole=1, labels={PRODUCT: "MTT-S4000"})
    assert "1 whole card (mthreads.com/gpu) and 1 sliced card:" in only(tainted, "whole-and-sliced").message
    tainted.nodes[0]["spec"] = {"taints": [{"key": taint[0], "value": taint[1], "effect": taint[2]}]}
    assert found(tainted, Settings(config=Config(sliced_node_taint=taint))) == []
    assert found(tainted, check="whole-and-sliced")  # the taint counts only when the webhook tolerates it


def test_a_mixed_cluster_needs_a_label_that_tells_models_apart():
    cluster = clean()
    for n in cluster.nodes:
        n["metadata"].get("labels", {}).pop(PRODUCT, None)
    f = only(cluster, "labels")
    assert f.object == "Nodes" and "cards of 96, 160 units" in f.message  # the hostname label does not count


def test_a_label_shared_across_models_does_not_tell_them_apart():
    cluster = clean()
    cluster.nodes.append(node("s5000-b", 128, 1280, labels={PRODUCT: "MTT-S4000"}))
    assert only(cluster, "labels").object == "Nodes"


def test_a_slice_pod_whose_selector_matches_no_sliced_node():
    cluster = clean()
    cluster.pods += [pod("typo", nodeSelector={PRODUCT: "MTT-S5OOO"}),
                     pod("pinned", nodeSelector={PRODUCT: "MTT-S5000"}),
                     pod("cpu", limits={"cpu": "1"}, nodeSelector={"x": "y"})]
    f = only(cluster, "labels")
    assert f.object == "Pod team/typo" and "matches none of the 2 sliced nodes" in f.message


# --- this webhook's registration ----------------------------------------------------------------------------

def hooks(cluster: Cluster) -> list[dict]:
    return [h for doc in cluster.mutating + cluster.validating for h in doc["webhooks"]]


@pytest.mark.parametrize("name", ["hami-mt-webhook-workloads", "hami-mt-webhook"])
def test_a_missing_configuration_says_what_stops_working(name):
    cluster = clean()
    cluster.validating = [d for d in cluster.validating if d["metadata"]["name"] != name]
    out = found(cluster)
    assert len(out) == len(shipped(name)) and {f.check for f in out} == {"registration"}
    assert all(f.object == f"ValidatingWebhookConfiguration {name}" and "is not registered" in f.message
               for f in out)


def test_failure_policies_as_shipped():
    cluster = clean()
    for hook in hooks(cluster):
        hook["failurePolicy"] = "Ignore" if hook["failurePolicy"] == "Fail" else "Fail"
    out = found(cluster)
    assert [f.check for f in out] == ["registration"] * len(shipped())
    closed = sum(hook["failurePolicy"] == "Fail" for hook in shipped())
    assert sum("failurePolicy Ignore: while it is unreachable" in f.message for f in out) == closed
    assert sum("failurePolicy Fail: an outage" in f.message for f in out) == len(shipped()) - closed


def test_match_conditions_removed_or_missing_a_slice_resource():
    cluster = clean()
    hooks(cluster)[0].pop("matchConditions")
    assert "has no matchConditions" in only(cluster, "registration").message
    renamed = Settings(config=Config(memory="example.com/slice-memory"))
    out = found(clean(), renamed, "registration")
    assert len(out) == len(shipped())
    assert all("do not name example.com/slice-memory" in f.message for f in out)


def test_a_ca_bundle_that_does_not_sign_the_served_certificate():
    cluster = clean()
    other = certs.new_ca("another-ca")
    cluster.mutating, cluster.validating = registered(ca_pem=other.cert_pem())
    out = found(cluster)
    assert len(out) == len(shipped())
    assert all("does not sign the certificate served at" in f.message for f in out)
    assert "another-ca" in out[0].message


def test_a_bundle_with_the_old_and_the_new_ca_signs():
    cluster = clean()
    cluster.mutating, cluster.validating = registered(ca_pem=certs.new_ca("new").cert_pem() + CA.cert_pem())
    assert found(cluster) == []


def test_no_ca_bundle():
    cluster = clean()
    for hook in hooks(cluster):
        hook["clientConfig"].pop("caBundle")
    assert len(found(cluster, check="registration")) == len(shipped())


@pytest.mark.parametrize(("later", "words"), [(0, "expires on"), (11, "expired on")])
def test_a_serving_certificate_near_or_past_its_end(later, words):
    cluster = clean()
    cluster.now = NOW + dt.timedelta(days=later)
    cluster.pods = []  # they would have waited for days
    leaf = certs.issue(CA, "x", dns=[HOST], days=10)
    cluster.served = {k: Served(pem=leaf.cert_pem(), source="served at x") for k in cluster.served}
    f = only(cluster, "registration")  # once for the endpoint the three webhooks share
    assert f.object == f"endpoint service {NS}/hami-mt-webhook:443"
    assert f.message.startswith(f"the serving certificate (served at x) {words}")


def test_a_ca_near_its_end():
    cluster = clean()
    ca = certs.new_ca(days=5)
    cluster.mutating, cluster.validating = registered(ca_pem=ca.cert_pem())
    leaf = certs.issue(ca, "x", dns=[HOST])
    cluster.served = {k: Served(pem=leaf.cert_pem(), source="served") for k in cluster.served}
    assert only(cluster, "registration").message.startswith("the CA hami-mt-webhook-ca expires on")


def test_a_served_certificate_for_another_name():
    cluster = clean()
    leaf = certs.issue(CA, "x", dns=["elsewhere.example.com"])
    cluster.served = {k: Served(pem=leaf.cert_pem(), source="served") for k in cluster.served}
    assert all(f"does not name {HOST}" in f.message for f in found(cluster))


def test_a_webhook_called_by_url_is_checked_against_what_the_url_serves():
    cluster = clean()
    cluster.mutating, cluster.validating = registered(url="https://127.0.0.1:8443")
    leaf = certs.issue(CA, "x", ips=["127.0.0.1"])
    served = Served(pem=leaf.cert_pem(), source="served at 127.0.0.1:8443")
    cluster.served = {"https://127.0.0.1:8443": served}
    assert found(cluster) == []  # no Service: no replicas to count
    cluster.served = {"https://127.0.0.1:8443": Served(pem=SERVING.cert_pem(), source="served")}
    assert all("does not name 127.0.0.1" in f.message for f in found(cluster))


def test_a_certificate_that_could_not_be_read_is_a_note():
    cluster = clean()
    cluster.served = {k: Served(error="no route to host") for k in cluster.served}
    f = only(cluster, "registration")
    assert not f.action and "no route to host" in f.message and f.object.startswith("endpoint service ")


def test_endpoint_keys():
    assert model.endpoint({"url": "https://[::1]:9443/mutate-pods"}) == "https://[::1]:9443"
    assert model.endpoint({"url": "https://webhook.example.com/x"}) == "https://webhook.example.com:443"
    assert model.endpoint({"service": {"namespace": "a", "name": "b"}}) == "service a/b:443"
    service = {"namespace": "a", "name": "b", "port": 8443}
    assert model.endpoint_host({"service": service}) == ("b.a.svc", 8443)


# --- availability -------------------------------------------------------------------------------------------

def test_replicas_not_ready():
    cluster = clean()
    cluster.deployments[0]["status"] = {"readyReplicas": 1}
    assert only(cluster, "availability").message.startswith("1 of 3 replicas ready;")
    cluster.deployments[0]["status"] = {}
    assert "no replica answers" in only(cluster, "availability").message


def test_a_single_replica():
    cluster = clean()
    cluster.deployments[0]["spec"]["replicas"] = 1
    cluster.deployments[0]["status"] = {"readyReplicas": 1}
    assert "runs 1 replica:" in only(cluster, "availability").message


def test_no_pdb_or_one_that_lets_every_replica_go():
    cluster = clean()
    cluster.pdbs[0]["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    assert "no PodDisruptionBudget covers its pods" in only(cluster, "availability").message
    cluster = clean()
    cluster.pdbs[0]["spec"] = {"maxUnavailable": 3, "selector": cluster.pdbs[0]["spec"]["selector"]}
    f = only(cluster, "availability")
    assert f.object == f"PodDisruptionBudget {NS}/hami-mt-webhook" and "evict every replica" in f.message


def test_a_missing_service_or_deployment():
    cluster = clean()
    cluster.deployments = []
    assert "no Deployment runs the pods" in only(cluster, "availability").message
    cluster.services = []
    assert "which could not be read (it does not exist)" in only(cluster, "availability").message


# --- quotas and pods -------------------------------------------------------------------------------------

def test_a_quota_with_limits_keys_only():
    cluster = clean()
    cluster.quotas.append({"metadata": {"name": "hami", "namespace": "team"},
                           "spec": {"hard": {f"limits.{MEMORY}": "64", f"limits.{VGPU}": "2"}}})
    f = only(cluster, "quota")
    assert f.object == "ResourceQuota team/hami"
    assert f"limits.{VGPU}, limits.{MEMORY} are never enforced" in f.message
    assert f"add requests.{VGPU}, requests.{MEMORY}" in f.message


def test_slice_pods_off_the_scheduler_each_with_the_fix():
    cluster = clean()
    cluster.namespaces.append({"metadata": {"name": "skipped", "labels": {"hami.io/webhook": "ignore"}}})
    cluster.pods += [
        pod("early", scheduler="default-scheduler", owner="train-5d8"),
        pod("bare", scheduler="default-scheduler"),
        pod("retired", scheduler="mt-gpu-scheduler"),
        pod("system", ns="kube-system", scheduler="default-scheduler"),
        pod("ignored", ns="skipped", scheduler="default-scheduler"),
        pod("volcano", scheduler="volcano"),
        pod("cpu", scheduler="default-scheduler", limits={"cpu": "1"}),
    ]
    settings = Settings(config=Config(retired_schedulers=("mt-gpu-scheduler",)))
    out = {f.object: f for f in found(cluster, settings)}
    assert set(out) == {f"Pod {ns}/{n}" for ns, n in [("team", "early"), ("team", "bare"),
                                                      ("team", "retired"), ("kube-system", "system"),
                                                      ("skipped", "ignored"), ("team", "volcano")]}
    assert "kubectl -n team delete pod early (its ReplicaSet train-5d8 creates it again" \
        in out["Pod team/early"].message
    assert "then create it again from its manifest" in out["Pod team/bare"].message
    assert "which is retired (--retired-schedulers)" in out["Pod team/retired"].message
    assert "which the webhooks skip" in out["Pod kube-system/system"].message
    assert "which the webhooks skip" in out["Pod skipped/ignored"].message
    assert not out["Pod team/volcano"].action
    assert "once volcano no longer runs, list it in --retired-schedulers (chart: `retiredSchedulers`)" \
        in out["Pod team/volcano"].message
    assert all(f.action for k, f in out.items() if k != "Pod team/volcano")


def test_pods_being_deleted_need_no_advice():
    cluster = clean()
    for p in (pod("a", scheduler="default-scheduler"), pod("b", created=NOW - dt.timedelta(hours=1)),
              pod("c", nodeSelector={PRODUCT: "none"})):
        p["metadata"]["deletionTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster.pods.append(p)
    assert found(cluster) == []


def test_the_live_namespace_selector_decides_what_is_skipped():
    cluster = clean()
    cluster.mutating[0]["webhooks"][0]["namespaceSelector"] = {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["team"]}]}
    cluster.pods.append(pod("p", scheduler="default-scheduler"))
    assert "which the webhooks skip" in only(cluster, "slice-pods").message


def test_checks_survive_objects_of_the_wrong_shape():
    cluster = clean()
    junk: list[Any] = [{}, {"metadata": None, "spec": None, "status": None}, {"spec": {"containers": None}}]
    for name in ("nodes", "pods", "deployments", "services", "pdbs", "quotas", "namespaces"):
        getattr(cluster, name).extend(copy.deepcopy(junk))
    cluster.mutating.append({"metadata": {"name": "x"}, "webhooks": [None, {"clientConfig": None}]})
    cluster.validating.append({"webhooks": "nonsense"})
    assert found(cluster) == []


def test_the_ca_bundle_field_is_base64_of_pem():
    hook = registered()[0][0]["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA.cert_pem()


def test_a_missing_rollout_mode_registration_names_the_namespaces_it_serves():
    cluster = clean()
    cluster.mutating = [d for d in cluster.mutating if d["metadata"]["name"] != "hami-mt-webhook-warn"]
    f = only(cluster, "registration")
    assert f.object == "MutatingWebhookConfiguration hami-mt-webhook-warn"
    assert "in namespaces labelled hami.io/enforcement: warn, slice pods are not mutated" in f.message


@pytest.mark.parametrize(("git", "expected"), [
    ("v1.29.15", ("action", "Kubernetes v1.29.15 is older than 1.30, the oldest this release supports")),
    ("v1.30.0", None), ("v1.37.2", None), ("v1.33.1-eks-abc", None),
    ("v1.38.0", ("note", "Kubernetes v1.38.0 is newer than 1.37, the newest this release is tested on")),
    ("v2.0.0", ("note", "is newer than 1.37")), ("", None), ("weird", None),
])
def test_kubernetes_version_below_the_floor_acts_and_above_the_newest_tested_notes(git, expected):
    cluster = Cluster(now=NOW, version={"gitVersion": git} if git else {})
    found = checks.kubernetes_version(cluster, Settings())
    if expected is None:
        assert found == []
        return
    (finding,) = found
    assert (finding.check, finding.object) == ("kubernetes-version", "API server")
    assert finding.severity == expected[0]
    assert expected[1] in finding.message and "docs/compatibility.md" in finding.message


def test_existing_pods_and_deployments_admission_would_refuse_are_named_with_its_message():
    """Without the audit's reports, doctor judges with the audit's findings: what admission would say now."""
    cluster = clean()
    cluster.namespaces.append({"metadata": {"name": "trial", "labels": {"hami.io/enforcement": "warn"}}})
    too_many = {VGPU: "1", MEMORY: "32", CORE: "17"}
    cluster.pods.append(pod("old", limits=too_many))
    cluster.deployments.append({"metadata": {"name": "train", "namespace": "trial"}, "spec": {"template": {
        "spec": {"containers": [{"name": "c", "resources": {"limits": too_many}}]}}}})
    out = {f.object: f for f in found(cluster, check="admission")}
    assert set(out) == {"Pod team/old", "Deployment trial/train"}
    assert out["Pod team/old"].action and not out["Deployment trial/train"].action  # warn mode: a note
    assert 'container "c": mthreads.com/sgpu-core 17 is not valid' in out["Pod team/old"].message


def test_the_audits_reports_are_read_rather_than_judged_again():
    """Where the replicas publish PolicyReports, doctor shows their findings (every kind the audit reads, not
    only what doctor lists) and does not judge those areas itself."""
    from hami_mt_webhook.audit.findings import Result
    from hami_mt_webhook.audit.objects import Subject
    from hami_mt_webhook.audit.reports import report

    cluster = clean()
    cluster.pods.append(pod("judged-by-the-audit", scheduler="default-scheduler"))  # the report does not name it
    job = Result("range", Subject("kubeflow.org/v1", "PyTorchJob", "team", "bert", "u1"), "fail", "too many cores")
    node = Result("capacity", Subject("v1", "Node", "", "odd", "u2"), "fail", "no card size")
    cluster.reports = [report("team", [job], 3, 1), report("", [node], 2, 1)]
    out = [(f.check, f.object, f.message) for f in found(cluster) if f.check in ("slice-pods", "capacity",
                                                                                 "admission")]
    assert out == [("capacity", "Node odd", "no card size"), ("admission", "PyTorchJob team/bert", "too many cores")]
