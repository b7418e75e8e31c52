"""`doctor` against a real kube-apiserver: each problem seeded, found with its exit status, then undone.

The module has its own control plane: doctor reads the whole cluster, and the session's cluster holds
what the other tests left (slice pods that wait for a scheduler that never runs there, for one). Its
webhook runs as a local process registered by URL, as in `make run`.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import manifests
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import apply_nodes, example_nodes
from devtools.clusters.local import LocalWebhook
from devtools.waiting import until
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.doctor import fetch
from hami_mt_webhook.service import certs

from .support import CORE, MEMORY, VGPU, WHOLE, apply, pod

TEAM = "doctor-team"
RETIRED = "mt-retired-scheduler"
NOBODY_MATCHES = {"matchExpressions": [{"key": "e2e.example.com/never", "operator": "Exists"}]}


def clean_nodes() -> list[dict[str, Any]]:
    """The example nodes, with sliced cards only on the sliced nodes (the examples also report them whole)."""
    nodes = example_nodes()
    for node in nodes:
        capacity = node["status"]["capacity"]
        if CORE in capacity:
            capacity.pop(WHOLE, None)
    return nodes


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


@pytest.fixture(scope="module")
def hook(cp: ControlPlane) -> Iterator[LocalWebhook]:
    webhook = LocalWebhook(cp, cp.workdir / "webhook", extra_args=["--reload-interval", "0.3"])
    webhook.install()
    apply_nodes(cp, clean_nodes())
    cp.kubectl("create", "namespace", TEAM)
    webhook.start()
    try:
        yield webhook
    finally:
        webhook.stop()


def doctor(cp: ControlPlane, capsys: pytest.CaptureFixture[str], *args: str,
           kubeconfig: Path | None = None) -> tuple[int, list[dict[str, str]]]:
    """Run `doctor -o json` in this process; the exit status and the findings."""
    capsys.readouterr()
    code = cli.main(["doctor", "--kubeconfig", str(kubeconfig or cp.kubeconfig), "-o", "json", *args])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), err
    return code, [json.loads(line) for line in out.splitlines()]


def lines(findings: list[dict[str, str]], check: str) -> list[str]:
    return [f"{f['object']}: {f['message']}" for f in findings if f["check"] == check]


def kubectl_apply(cp: ControlPlane, *docs: dict[str, Any]) -> None:
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def test_a_clean_install_reports_nothing(cp, hook, capsys, installed):
    assert doctor(cp, capsys) == (0, [])
    # And the installed command, as an operator runs it: nothing on stdout, exit status 0.
    run = subprocess.run([str(installed.exe), "doctor", "--kubeconfig", str(cp.kubeconfig)],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert (run.returncode, run.stdout) == (0, ""), run.stderr
    assert run.stderr == "13 checks: 0 findings to act on, 0 notes\n"


def test_the_vendors_scheduler_and_webhook(cp, hook, capsys):
    cp.kubectl("create", "namespace", "mt-gpu-operator")
    cp.kubectl("-n", "mt-gpu-operator", "create", "deployment", "mt-gpushare-scheduler", "--image=example.com/x")
    vendor_hook = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mt-gpu-webhook"},
        "webhooks": [{"name": "gpu.mthreads.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "failurePolicy": "Ignore", "objectSelector": NOBODY_MATCHES,
                      "clientConfig": {"service": {"namespace": "mt-gpu-operator", "name": "mt-gpu-webhook"}},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods"]}]}]}
    kubectl_apply(cp, vendor_hook)
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        assert [f["object"] for f in found] == ["Deployment mt-gpu-operator/mt-gpushare-scheduler",
                                                "MutatingWebhookConfiguration mt-gpu-webhook"]
        assert all(f["check"] == "vendor" and "ClusterPolicy" in f["message"] for f in found)
    finally:
        cp.kubectl("delete", "namespace", "mt-gpu-operator", "--wait=false")
        cp.kubectl("delete", "mutatingwebhookconfiguration", "mt-gpu-webhook")
    # A namespace being deleted still lists its Deployment until the garbage collector (absent here) runs.
    cp.kubectl("-n", "mt-gpu-operator", "delete", "deployment", "mt-gpushare-scheduler", "--ignore-not-found")
    assert doctor(cp, capsys) == (0, [])


#: HAMi's chart's selectors for its webhook, namespace and object alike.
HAMI_SELECTOR: dict[str, Any] = {
    "matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}


def hami_device_config(per_card: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "hami-scheduler-device", "namespace": "kube-system"},
            "data": {"device-config.yaml": f"nvidia:\n  resourceCountName: nvidia.com/gpu\nmthreads:\n"
                                           f"  resourceCountName: mthreads.com/vgpu\n  memoryPerCard: {per_card}\n"}}


def test_hamis_webhook_and_its_memory_per_card(cp, hook, capsys):
    hami: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "hami-webhook"},
        "webhooks": [{"name": "vgpu.hami.io", "admissionReviewVersions": ["v1beta1"], "sideEffects": "None",
                      "failurePolicy": "Ignore", "objectSelector": NOBODY_MATCHES,
                      "clientConfig": {"service": {"namespace": "kube-system", "name": "hami-scheduler",
                                                   "path": "/webhook"}},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods"]}]}]}
    kubectl_apply(cp, hami, hami_device_config("[96]"))
    reader = cp.user_kubeconfig("doctor-reader")
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        (line,) = lines(found, "hami-webhook")
        assert line.startswith("MutatingWebhookConfiguration hami-webhook: HAMi's webhook vgpu.hami.io also admits")
        assert "nodes report cards of 160 units" in line and "memoryPerCard to [96, 160]" in line

        kubectl_apply(cp, hami_device_config("[96, 160]"))
        assert doctor(cp, capsys) == (0, [])

        # Registered as HAMi's chart registers it (every pod outside `hami.io/webhook: ignore`): both
        # webhooks mutate the same slice pods. No pod is created meanwhile, so nothing waits on its Service.
        hami["webhooks"][0].update(objectSelector=HAMI_SELECTOR, namespaceSelector=HAMI_SELECTOR,
                                   timeoutSeconds=1)
        kubectl_apply(cp, hami)
        code, found = doctor(cp, capsys)
        assert code == 1
        (line,) = lines(found, "hami-webhook")
        assert "is registered for the same pods as this webhook (slice pods in default" in line
        assert "--set scheduler.admissionWebhook.enabled=false" in line
        hami["webhooks"][0].update(objectSelector=NOBODY_MATCHES)
        kubectl_apply(cp, hami)
        assert doctor(cp, capsys) == (0, [])

        # Someone who may read what doctor needs, but not ConfigMaps: a note, not a failure.
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "e2e-doctor-reader"},
                "rules": [{"apiGroups": ["", "apps", "policy", "admissionregistration.k8s.io"],
                           "resources": ["nodes", "namespaces", "pods", "resourcequotas", "deployments",
                                         "poddisruptionbudgets", "mutatingwebhookconfigurations",
                                         "validatingwebhookconfigurations"], "verbs": ["get", "list"]}]}
        kubectl_apply(cp, role)
        cp.kubectl("create", "clusterrolebinding", "e2e-doctor-reader", "--clusterrole=e2e-doctor-reader",
                   "--user=doctor-reader")
        code, found = doctor(cp, capsys, kubeconfig=reader)
        assert code == 0
        (note,) = found
        assert note["severity"] == "note" and "ConfigMap kube-system/hami-scheduler-device: no permission" \
            in note["message"]
    finally:
        cp.kubectl("delete", "mutatingwebhookconfiguration", "hami-webhook")
        cp.kubectl("-n", "kube-system", "delete", "configmap", "hami-scheduler-device")
        cp.kubectl("delete", "clusterrolebinding,clusterrole", "e2e-doctor-reader", "--ignore-not-found")


def test_without_permission_or_credentials_it_cannot_run(cp, hook, capsys):
    capsys.readouterr()
    assert cli.main(["doctor", "--kubeconfig", str(cp.user_kubeconfig("no-rights"))]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("hami-mt-webhook doctor: no permission to list nodes in all namespaces (")


def test_pods_waiting_for_a_scheduler_that_does_not_answer(cp, hook, capsys):
    assert apply(cp, TEAM, pod("waits", {VGPU: 1, MEMORY: 32, CORE: 8})).returncode == 0
    try:
        assert doctor(cp, capsys) == (0, [])  # younger than 5 minutes
        code, found = doctor(cp, capsys, "--pending-minutes", "0")
        assert code == 1
        assert lines(found, "scheduler") == [
            "scheduler hami-scheduler: 1 pod has waited 0 minutes or more without any scheduler trying to place it "
            f"({TEAM}/waits): nothing answers to schedulerName hami-scheduler; install or restart HAMi's scheduler "
            "(kubectl -n kube-system get deploy hami-scheduler) and check that it runs as hami-scheduler (HAMi's "
            "schedulerName value)"]
        # What a scheduler does when it cannot place the pod: it answers, so nothing is reported.
        condition = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": "0/2 nodes are available"}]}}
        cp.kubectl("-n", TEAM, "patch", "pod", "waits", "--subresource=status", "--type=merge", "-p",
                   json.dumps(condition))
        assert doctor(cp, capsys, "--pending-minutes", "0") == (0, [])
    finally:
        cp.kubectl("-n", TEAM, "delete", "pod", "waits", "--wait=false")


def node(name: str, cores: int, memory: int, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"cpu": "8", CORE: str(cores), MEMORY: str(memory)}}}


def test_node_reports_and_labels(cp, hook, capsys):
    product = "mthreads.com/gpu.product"
    apply_nodes(cp, [node("overcommitted", 128, 1408, **{product: "MTT-S5000-oc"}),
                     node("odd", 24, 96, **{product: "MTT-S4000"})])
    whole = {"status": {"capacity": {WHOLE: "8"}}}
    cp.kubectl("patch", "node", "s5000-node", "--subresource=status", "--type=merge", "-p", json.dumps(whole))
    typo = pod("typo", {VGPU: 1, MEMORY: 32, CORE: 8}, nodeSelector={product: "MTT-S5OOO"})
    assert apply(cp, TEAM, typo).returncode == 0
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        capacity = lines(found, "capacity")
        assert capacity[0].startswith("Node odd: reports mthreads.com/sgpu-core 24 and mthreads.com/sgpu-memory 96, "
                                      "which is no sliced-card report")
        assert capacity[1].startswith("Node overcommitted: reports 176 units of mthreads.com/sgpu-memory per card, "
                                      "1.10 times a 160-unit card")
        assert len(capacity) == 2
        assert lines(found, "whole-and-sliced") == [
            "Node s5000-node: reports 8 whole cards (mthreads.com/gpu) and 8 sliced cards on a node of 8 cards "
            "(mthreads.com/gpu.count): the same cards may go to a whole-card pod (default-scheduler) and to slices "
            "(hami-scheduler) at once, and neither scheduler sees the other; slice a fixed subset of the cards "
            "(gpu_ids), or taint the node and run the webhook with --sliced-node-taint (chart: `slicedNodeTaint`), "
            "as docs/mixed-clusters.md#whole-cards-and-slices-on-one-node says"]
        (typo_line,) = lines(found, "labels")
        assert typo_line.startswith(f"Pod {TEAM}/typo: its nodeSelector or required node affinity matches none of the "
                                    "3 sliced nodes")

        # A sliced node without the model label: the label no longer tells the models apart.
        cp.kubectl("delete", "node", "odd", "overcommitted")
        apply_nodes(cp, [node("unlabelled", 128, 1280)])
        assert [f["object"] for f in doctor(cp, capsys)[1] if f["check"] == "labels"] == ["Nodes", f"Pod {TEAM}/typo"]
    finally:
        cp.kubectl("-n", TEAM, "delete", "pod", "typo", "--wait=false")
        cp.kubectl("delete", "node", "odd", "overcommitted", "unlabelled", "--ignore-not-found")
        cp.kubectl("patch", "node", "s5000-node", "--subresource=status", "--type=json", "-p",
                   json.dumps([{"op": "remove", "path": "/status/capacity/mthreads.com~1gpu"}]))
    assert doctor(cp, capsys) == (0, [])


def test_quotas_with_limits_keys_only(cp, hook, capsys):
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "hami-style", "namespace": TEAM},
             "spec": {"hard": {f"limits.{MEMORY}": "64", f"requests.{CORE}": "16"}}}
    kubectl_apply(cp, quota)  # the API server accepts the key; its quota controller never counts it
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        assert lines(found, "quota") == [
            f"ResourceQuota {TEAM}/hami-style: limits.{MEMORY} is never enforced: Kubernetes counts extended resources "
            f"by requests only; add requests.{MEMORY} with the same value (every slice pod has requests equal to "
            "limits, so it counts what the pod gets)"]
    finally:
        cp.kubectl("-n", TEAM, "delete", "resourcequota", "hami-style")


def test_slice_pods_outside_hami_with_the_fix(cp, hook, capsys):
    cp.kubectl("create", "namespace", "doctor-skipped")
    cp.kubectl("label", "namespace", "doctor-skipped", "hami.io/webhook=ignore")
    cp.kubectl("create", "namespace", "doctor-outage")
    cp.kubectl("label", "namespace", "doctor-outage", "hami.io/webhook=ignore")
    slices = {VGPU: 1, MEMORY: 32, CORE: 8}
    assert apply(cp, "doctor-skipped", pod("skipped", slices)).returncode == 0
    # As if created while the webhook was unreachable: stored on default-scheduler, in a namespace it covers.
    assert apply(cp, "doctor-outage", pod("early", slices)).returncode == 0
    cp.kubectl("label", "namespace", "doctor-outage", "hami.io/webhook-")
    # This webhook leaves a named scheduler alone unless told it is retired.
    assert apply(cp, TEAM, pod("vendor-named", slices, schedulerName=RETIRED)).returncode == 0
    try:
        code, found = doctor(cp, capsys, "--retired-schedulers", RETIRED)
        assert code == 1
        assert lines(found, "slice-pods") == [
            "Pod doctor-outage/early: asks for slices on default-scheduler, outside HAMi's accounting (created before "
            "the webhook was installed, or while it was unreachable); recreate it: kubectl -n doctor-outage delete "
            "pod early, then create it again from its manifest",
            "Pod doctor-skipped/skipped: asks for slices in namespace doctor-skipped, which the webhooks skip, so it "
            "is on default-scheduler, outside HAMi's accounting: run slice workloads in another namespace "
            "(docs/operating.md#who-may-switch-the-checks-off)",
            f"Pod {TEAM}/vendor-named: names scheduler {RETIRED}, which is retired (--retired-schedulers): nothing "
            f"will schedule it; recreate it: kubectl -n {TEAM} delete pod vendor-named, then create it again from its "
            "manifest, and remove schedulerName from its manifest"]
        # Without the setting the named scheduler may be deliberate: a note, and nothing to act on for it.
        code, found = doctor(cp, capsys)
        assert [(f["object"], f["severity"]) for f in found] == [
            ("Pod doctor-outage/early", "action"), ("Pod doctor-skipped/skipped", "action"),
            (f"Pod {TEAM}/vendor-named", "note")]
    finally:
        cp.kubectl("delete", "namespace", "doctor-skipped", "doctor-outage", "--wait=false")
        cp.kubectl("-n", TEAM, "delete", "pod", "vendor-named", "--wait=false")
    for ns, name in [("doctor-skipped", "skipped"), ("doctor-outage", "early")]:
        cp.kubectl("-n", ns, "delete", "pod", name, "--ignore-not-found", "--wait=false")
    assert doctor(cp, capsys) == (0, [])


def patch(cp: ControlPlane, kind: str, name: str, ops: list[dict[str, Any]]) -> None:
    cp.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(ops))


def test_registration_failure_policy_match_conditions_and_presence(cp, hook, capsys):
    patch(cp, "validatingwebhookconfiguration", "hami-mt-webhook-workloads",
          [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"},
           {"op": "remove", "path": "/webhooks/0/matchConditions"}])
    patch(cp, "mutatingwebhookconfiguration", "hami-mt-webhook",
          [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}])
    cp.kubectl("delete", "validatingwebhookconfiguration", "hami-mt-webhook")
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        assert [f["object"] for f in found if f["check"] == "registration"] == [
            "MutatingWebhookConfiguration hami-mt-webhook", "ValidatingWebhookConfiguration hami-mt-webhook",
            "ValidatingWebhookConfiguration hami-mt-webhook-workloads",
            "ValidatingWebhookConfiguration hami-mt-webhook-workloads"]
        messages = " ".join(lines(found, "registration"))
        assert "failurePolicy Ignore: while it is unreachable" in messages
        assert "failurePolicy Fail: an outage of the webhook then blocks every rollout" in messages
        assert "has no matchConditions" in messages
        assert "webhook validate.hami-mt.mthreads.com is not registered: pods are not checked again" in messages
    finally:
        hook.install()
    assert doctor(cp, capsys) == (0, [])


def _served_serial(hook: LocalWebhook) -> int:
    from cryptography import x509
    return x509.load_pem_x509_certificate(fetch.probe("127.0.0.1", hook.port)).serial_number


def _reloaded(hook: LocalWebhook, serial: int) -> None:
    """The webhook serves a certificate other than `serial`: it reloads its files a moment after they change."""
    until("the webhook serving the rotated certificate", lambda: _served_serial(hook) != serial, 20, 0.2)


def test_ca_bundle_against_the_served_certificate_and_its_expiry(cp, hook, capsys):
    other = base64.b64encode(certs.new_ca("another-ca").cert_pem()).decode()
    patch(cp, "mutatingwebhookconfiguration", "hami-mt-webhook",
          [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": other}])
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        (line,) = lines(found, "registration")
        assert line.startswith("MutatingWebhookConfiguration hami-mt-webhook: the caBundle of webhook "
                               "mutate.hami-mt.mthreads.com (CA another-ca) does not sign the certificate served at "
                               f"127.0.0.1:{hook.port}")
    finally:
        hook.install()

    root = hook.certs.tls_cert.parent
    before = _served_serial(hook)
    certs.rotate(root, days=10, force=True)  # keeps the CA and the certificate's names
    try:
        _reloaded(hook, before)
        code, found = doctor(cp, capsys)
        assert code == 1
        (f,) = found  # the three webhook configurations call one endpoint: one finding
        assert f["object"] == f"endpoint {hook.url}"
        assert f["message"].startswith(f"the serving certificate (served at 127.0.0.1:{hook.port}) expires on ")
        assert ", in 9 days: rotate it now" in f["message"]
    finally:
        renewed = _served_serial(hook)
        certs.rotate(root, force=True)
        _reloaded(hook, renewed)
    assert doctor(cp, capsys) == (0, [])


def test_replicas_and_pdb_behind_a_service(cp, hook, capsys):
    """The webhook as installed in a cluster: called through its Service, run by the Deployment. There is no
    kube-controller-manager or kubelet here, so none of its replicas ever becomes ready."""
    in_cluster = [d for d in manifests.load() if d["kind"] in ("Service", "Deployment", "PodDisruptionBudget")]
    kubectl_apply(cp, *in_cluster)
    ns = "hami-mt-webhook"
    layout = hook.certs
    cp.kubectl("-n", ns, "create", "secret", "generic", "hami-mt-webhook-tls", f"--from-file=tls.crt={layout.tls_cert}",
               f"--from-file=tls.key={layout.tls_key}", f"--from-file=ca.crt={layout.ca_cert}")
    service = {"namespace": ns, "name": "hami-mt-webhook", "port": 443, "path": "/validate-workloads"}
    patch(cp, "validatingwebhookconfiguration", "hami-mt-webhook-workloads",
          [{"op": "remove", "path": "/webhooks/0/clientConfig/url"},
           {"op": "add", "path": "/webhooks/0/clientConfig/service", "value": service}])
    try:
        code, found = doctor(cp, capsys)
        assert code == 1
        # The Service's name does not resolve here, so the certificate is read from the Secret the pods
        # mount; it is the one the CA bundle signs, for the Service's name: nothing to report about it.
        assert lines(found, "registration") == []
        assert lines(found, "availability") == [
            f"Deployment {ns}/hami-mt-webhook: 0 of 3 replicas ready: no replica answers, so every slice pod is "
            f"refused; see kubectl -n {ns} describe deployment hami-mt-webhook, and the events and logs of its pods"]

        cp.kubectl("-n", ns, "delete", "pdb", "hami-mt-webhook")
        code, found = doctor(cp, capsys)
        assert lines(found, "availability")[1] == (
            f"Deployment {ns}/hami-mt-webhook: no PodDisruptionBudget covers its pods: a node drain may evict every "
            "replica at once; apply manifests/pdb.yaml (minAvailable: 1)")

        cp.kubectl("-n", ns, "delete", "secret", "hami-mt-webhook-tls")
        code, found = doctor(cp, capsys)
        (note,) = [f for f in found if f["check"] == "registration"]
        assert note["severity"] == "note"
        assert "hami-mt-webhook.hami-mt-webhook.svc:443 is not reachable from here" in note["message"]
        assert "Secret hami-mt-webhook/hami-mt-webhook-tls: it does not exist" in note["message"]
    finally:
        cp.kubectl("-n", ns, "delete", "deployment,service,pdb,secret", "hami-mt-webhook", "hami-mt-webhook-tls",
                   "--ignore-not-found")
        # kubectl apply would merge a url into the service: put the url back by hand.
        patch(cp, "validatingwebhookconfiguration", "hami-mt-webhook-workloads",
              [{"op": "remove", "path": "/webhooks/0/clientConfig/service"},
               {"op": "add", "path": "/webhooks/0/clientConfig/url", "value": f"{hook.url}/validate-workloads"}])
    assert doctor(cp, capsys) == (0, [])
