"""No pod creation lost while Kubernetes itself restarts, moves, upgrades, re-keys and removes the webhook.

Each test creates slice pods through the API at 20 a second (the webhooks fail closed, so every one of
them needs a replica) while the chart's Deployment goes through one of the things that happen to it on
a cluster, and counts every creation's outcome: all must be created. The replicas run on the real node
(`conftest.chart`), reached by kube-apiserver through the Service's endpoints; nothing here stops a
process itself: kubectl, helm and kubelet do, with the chart's preStop, probes, PodDisruptionBudget and
rolling-update settings. Runs after the other modules of the tier (it ends with `helm uninstall`).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from devtools import paths
from devtools.clusters import helm_release, manifests
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread, PodCreator, creating
from hami_mt_webhook import __version__
from hami_mt_webhook.service import certs
from tests.e2e.support import VGPU, WHOLE, pod

from .conftest import MEASURED, NAMESPACE, RATE, UPGRADES, USER_VALUES, upgrades_run
from .replicas import DEPLOYMENT, failover_working, ready, replicas, rolled_out, wait_for

CONFIGS = (("mutatingwebhookconfiguration", "hami-mt-webhook"), ("validatingwebhookconfiguration", "hami-mt-webhook"),
           ("validatingwebhookconfiguration", "hami-mt-webhook-workloads"),
           ("mutatingwebhookconfiguration", "hami-mt-webhook-warn"),
           ("validatingwebhookconfiguration", "hami-mt-webhook-warn"))


#: Seconds of traffic kept up once the operation is over: what goes wrong just after it (a replica put back
#: too early, a late restart) is counted too, and the window no longer than that.
TAIL = 8.0


@contextmanager
def load(node: NodeCluster, lt: LoopThread, what: str, seconds: float) -> Iterator[PodCreator]:
    """Slice pods created at RATE in a namespace of their own while the block runs and TAIL seconds after,
    `seconds` at the most; on leaving, every creation must have succeeded, and no replica may have restarted
    or logged a traceback."""
    ns = "load-" + re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")[:40]
    started = time.monotonic()
    with creating(node.controlplane, lt, ns, RATE, seconds) as creator:
        yield creator
        time.sleep(max(0.0, min(TAIL, started + seconds - time.monotonic())))
        creator.stop()
        stopped = time.monotonic()
    sent = len(creator.outcomes)
    MEASURED.append(f"{what}: {creator.results[201]}/{sent} pods created, {len(creator.failures)} failed "
                    f"({time.monotonic() - started:.0f} s)")
    assert creator.failures == [], (creator.failures[:5], verdicts(node))
    assert creator.results[201] == sent >= RATE * (min(seconds, stopped - started) - 1), "the rate was not kept"
    assert_replicas_healthy(node)


def verdicts(node: NodeCluster) -> list[str]:
    """The failover verdicts the replicas logged: what took a replica out of the endpoints, and when."""
    lines = []
    for p in replicas(node, terminating=True):
        logs = node.kubectl("logs", "-n", NAMESPACE, p["metadata"]["name"], check=False).stdout
        lines += [line for line in logs.splitlines() if "marked" in line or "could not mark" in line]
    return lines


def assert_replicas_healthy(node: NodeCluster) -> None:
    """No replica restarted by kubelet, and none logged a traceback."""
    for p in replicas(node):
        name = p["metadata"]["name"]
        restarts = sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
        assert restarts == 0, f"{name} restarted {restarts} times"
        logs = node.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout
        assert "Traceback" not in logs, f"{name}:\n{logs[-3000:]}"


def replica_metric(node: NodeCluster, pod_name: str, metric: str) -> float | None:
    text = node.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name}:9090/proxy/metrics",
                        check=False).stdout
    found = re.search(rf"^{re.escape(metric)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def helm(node: NodeCluster, *args: str) -> None:
    helm_release.helm(node.controlplane, *args)


def test_helm_upgrade_from_the_previous_release_loses_no_pod(chart: NodeCluster) -> None:
    """The chart fixture installed the previous release's chart and image, then ran `helm upgrade` to this
    tree's chart under RATE slice pods a second: every creation succeeded, every replica runs the new image,
    and failover works afterwards (each replica gated by its condition and hearing the others)."""
    if not upgrades_run(chart):
        pytest.skip("the upgrade from the previous release runs on the newest Kubernetes only")
    (done,) = UPGRADES
    assert done.failures == [], done.failures[:5]
    assert done.created == done.total
    assert done.images == [f"{helm_release.NODE_IMAGE_REPOSITORY}:{__version__}"]
    assert len(done.failover) == helm_release.REPLICAS and all(s["gate"] for s in done.failover.values()), done.failover
    assert all(len(s["heard"]) >= helm_release.REPLICAS - 1 and not s["silent"] for s in done.failover.values())
    assert_replicas_healthy(chart)


def test_rollout_restart_loses_no_pod(chart: NodeCluster, lt: LoopThread) -> None:
    before = set(ready(chart))
    with load(chart, lt, "kubectl rollout restart", 40):
        time.sleep(3)
        chart.kubectl("rollout", "restart", DEPLOYMENT, "-n", NAMESPACE)
        rolled_out(chart)
    assert not before & set(ready(chart)), "every replica was replaced"


def test_a_deleted_replica_loses_no_pod(chart: NodeCluster, lt: LoopThread) -> None:
    victim = ready(chart)[0]
    with load(chart, lt, "kubectl delete pod", 30):
        time.sleep(3)
        started = time.monotonic()
        chart.kubectl("delete", "pod", victim, "-n", NAMESPACE, timeout=60)
        MEASURED.append(f"kubectl delete pod (preStop 5 s, then SIGTERM): {time.monotonic() - started:.1f} s")
        rolled_out(chart)
    assert victim not in ready(chart)


def test_a_drain_respects_the_disruption_budget_and_loses_no_pod(chart: NodeCluster, lt: LoopThread) -> None:
    """One node holds all three replicas: the drain evicts two (the replacements cannot be placed on the
    cordoned node) and the PodDisruptionBudget refuses the third, so one replica always answers."""
    node_name = chart.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=hami-mt-webhook",
                              "-o", "jsonpath={.items[0].spec.nodeName}").stdout
    fewest = 3
    with load(chart, lt, "kubectl drain (PodDisruptionBudget minAvailable 1)", 40):
        time.sleep(3)
        drain = chart.kubectl("drain", node_name, "--ignore-daemonsets", "--delete-emptydir-data",
                              "--timeout=20s", check=False, timeout=60)
        fewest = min(fewest, len(ready(chart)))
        assert drain.returncode != 0 and "disruption budget" in drain.stderr, drain.stderr[-2000:]
        assert len(ready(chart)) >= 1
        chart.kubectl("uncordon", node_name)
        rolled_out(chart)
    MEASURED.append(f"drain: {fewest} replica(s) Ready at its end, the budget refused the last eviction")


def test_helm_upgrade_of_a_value_loses_no_pod_and_takes_effect(chart: NodeCluster, lt: LoopThread) -> None:
    mixed = pod("mixed", {VGPU: 1, WHOLE: 1})
    with load(chart, lt, "helm upgrade --set enforcement=warn and back", 60):
        time.sleep(3)
        helm(chart, "upgrade", helm_release.RELEASE, str(paths.CHART), "-n", NAMESPACE, "--reuse-values",
             "--set", "enforcement=warn")
        rolled_out(chart)
        ns = "upgrade-check"
        chart.kubectl("create", "namespace", ns)
        warned = chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mixed))
        assert "would deny" in warned.stderr, warned.stderr  # warn is in force: created, with the warning
        helm(chart, "upgrade", helm_release.RELEASE, str(paths.CHART), "-n", NAMESPACE, "--reuse-values",
             "--set", "enforcement=deny")
        rolled_out(chart)
        mixed["metadata"]["name"] = "mixed-again"
        denied = chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mixed), check=False)
        assert denied.returncode != 0 and "asks for mthreads.com/gpu" in denied.stderr, denied.stderr
        chart.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_rotated_certificate_is_reloaded_without_a_restart_and_loses_no_pod(chart: NodeCluster,
                                                                                lt: LoopThread) -> None:
    """A renewal to a new CA, done in the order that keeps every call trusted: the webhook configurations
    trust the old and the new CA, the Secret is replaced (kubelet swaps the mounted files through
    `..data`), every replica serves the new certificate without a restart, then only the new CA is
    trusted."""
    ca = certs.new_ca()
    names = certs.service_names(helm_release.RELEASE, NAMESPACE)
    serving = certs.issue(ca, names[2], dns=names)
    secret = json.loads(chart.kubectl("get", "secret", "hami-mt-webhook-tls", "-n", NAMESPACE, "-o", "json").stdout)
    old_ca = base64.b64decode(secret["data"]["ca.crt"])
    names = ready(chart)
    with load(chart, lt, "TLS Secret rotated (kubelet's atomic swap of the mounted files)", 90):
        time.sleep(3)
        set_ca_bundle(chart, old_ca + ca.cert_pem())
        secret["data"] = {"ca.crt": b64(ca.cert_pem()), "tls.crt": b64(serving.cert_pem()),
                          "tls.key": b64(serving.key_pem())}
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            secret["metadata"].pop(key, None)
        chart.kubectl("replace", "-f", "-", input=json.dumps(secret))
        expiry = serving.cert.not_valid_after_utc.timestamp()
        took = wait_for("every replica serving the new certificate", lambda: all(
            replica_metric(chart, n, "hami_mt_webhook_certificate_expiry_timestamp_seconds") == expiry
            for n in names), timeout=150)
        MEASURED.append(f"TLS Secret replaced to every replica serving it: {took:.0f} s (kubelet's sync, then "
                        "the webhook's reload)")
        set_ca_bundle(chart, ca.cert_pem())
    assert ready(chart) == names, "the replicas were restarted"


def test_with_every_replica_gone_slice_pods_are_refused_and_whole_cards_created(chart: NodeCluster) -> None:
    ns = "outage"
    chart.kubectl("create", "namespace", ns)
    try:
        chart.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=0")
        wait_for("no replica left", lambda: not replicas(chart, terminating=True), timeout=120)
        refused = chart.kubectl("create", "-n", ns, "-f", "-", check=False,
                                input=json.dumps(pod("slice-down", {VGPU: 1})))
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
        assert "mutate.hami-mt.mthreads.com" in refused.stderr, refused.stderr
        chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(pod("whole-down", {WHOLE: 1})))
        chart.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=3")
        took = wait_for("3 replicas Ready again", lambda: len(ready(chart)) == 3)
        MEASURED.append(f"scaled 0 -> 3: slice pods admitted again {took:.1f} s after the scale")
        created = chart.kubectl("create", "-n", ns, "-f", "-", "-o", "json",
                                input=json.dumps(pod("slice-up", {VGPU: 1})))
        assert json.loads(created.stdout)["spec"]["schedulerName"] == "hami-scheduler"
        chart.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(pod("whole-up", {WHOLE: 1})))
    finally:
        chart.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=3")
        chart.kubectl("delete", "namespace", ns, "--wait=false")
    assert_replicas_healthy(chart)


def test_uninstall_leaves_no_webhook_configuration_or_policy(chart: NodeCluster) -> None:
    assert_replicas_healthy(chart)
    helm(chart, "uninstall", helm_release.RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
    for kind, name in CONFIGS:
        assert chart.kubectl("get", kind, name, check=False).returncode != 0, (kind, name)
    policies = chart.kubectl("get", "validatingadmissionpolicies,validatingadmissionpolicybindings",
                             "-o", "name").stdout
    assert "hami-mt" not in policies, policies
    # Nothing is left to refuse a slice pod once kube-apiserver's admission has seen the deletions (its
    # policy and webhook caches follow the objects within seconds).
    ns = "after-uninstall"
    chart.kubectl("create", "namespace", ns)
    manifest = json.dumps(pod("slice", {VGPU: 1}))
    took = wait_for("a slice pod admitted with nothing installed", lambda: chart.kubectl(
        "create", "-n", ns, "-f", "-", input=manifest, check=False).returncode == 0, timeout=30)
    MEASURED.append(f"helm uninstall --wait to a slice pod admitted unchanged: {took:.1f} s more")
    created = json.loads(chart.kubectl("get", "pod", "slice", "-n", ns, "-o", "json").stdout)
    assert created["spec"].get("schedulerName") == "default-scheduler"


def set_ca_bundle(node: NodeCluster, bundle: bytes) -> None:
    encoded = b64(bundle)
    for kind, name in CONFIGS:
        hooks = json.loads(node.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"]
        patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
                 for i in range(len(hooks))]
        node.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_from_the_kustomize_base_to_the_chart_loses_no_pod(chart: NodeCluster, lt: LoopThread, tmp_path: Path) -> None:
    """The kustomize base installed as the README says (its certificate from `hami-mt-webhook certs`), then
    adopted by the chart under RATE slice pods a second, as docs/upgrading.md says: every object labelled and
    annotated as Helm's own, the TLS Secret included, then `helm upgrade --install`. The chart reads that
    Secret back and keeps it, so the caBundle does not change and no call is refused. Runs after the
    uninstall above, and leaves the chart installed."""
    if not upgrades_run(chart):
        pytest.skip("the move to the chart runs on the newest Kubernetes only, as the upgrade does")
    made = subprocess.run([sys.executable, "-m", "hami_mt_webhook", "certs", "--dir", str(tmp_path / "certs")],
                          capture_output=True, text=True, check=True)
    assert (tmp_path / "certs" / "webhook-configurations.yaml").is_file(), made.stderr
    overlay = image_overlay(tmp_path)
    chart.kubectl("apply", "-f", str(manifests.base_dir() / "namespace.yaml"))
    chart.kubectl("-n", NAMESPACE, "create", "secret", "generic", TLS_SECRET,
                  *(f"--from-file={tmp_path / 'certs' / f}" for f in ("tls.crt", "tls.key", "ca.crt")))
    chart.kubectl("apply", "-k", str(overlay))
    chart.kubectl("apply", "-f", str(tmp_path / "certs" / "webhook-configurations.yaml"))
    wait_for("the kustomize base's 3 replicas Ready", lambda: len(ready(chart)) == helm_release.REPLICAS)
    bundles = ca_bundles(chart)
    objects = [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
               for d in yaml.safe_load_all(chart.kubectl("kustomize", str(overlay)).stdout) if d["kind"] != "Namespace"]
    with load(chart, lt, "kustomize base adopted by helm upgrade --install", 60):
        time.sleep(3)
        for kind, name, namespace in [*objects, ("Secret", TLS_SECRET, NAMESPACE)]:
            where = ["-n", namespace] if namespace else []
            chart.kubectl("label", kind, name, *where, "app.kubernetes.io/managed-by=Helm", "--overwrite")
            chart.kubectl("annotate", kind, name, *where, f"meta.helm.sh/release-name={helm_release.RELEASE}",
                          f"meta.helm.sh/release-namespace={NAMESPACE}", "--overwrite")
        # Helm 4 applies server-side: the fields `kubectl apply` set are another manager's until forced over.
        helm(chart, "upgrade", "--install", helm_release.RELEASE, str(paths.CHART), "-n", NAMESPACE, *USER_VALUES,
             "--force-conflicts")
        rolled_out(chart)
        took = wait_for("failover: every replica gated and hearing the others", lambda: failover_working(chart), 60)
        MEASURED.append(f"kustomize base to chart: failover settled {took:.0f} s after the rollout")
    assert ca_bundles(chart) == bundles, "the caBundle changed"
    assert len(set(bundles.values())) == 1
    listed = helm_release.helm(chart.controlplane, "get", "manifest", helm_release.RELEASE, "-n", NAMESPACE).stdout
    assert all(f"name: {name}" in listed for _, name, _ in objects)


TLS_SECRET = "hami-mt-webhook-tls"


def image_overlay(dest: Path) -> Path:
    """The kustomize base with the image built here, as `kustomize edit set image` sets it (README)."""
    base = dest / "base"
    shutil.copytree(manifests.base_dir(), base, ignore=shutil.ignore_patterns("components"))
    (dest / "overlay").mkdir()
    (dest / "overlay" / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": ["../base"],
        "images": [{"name": "hami-mt-webhook", "newName": helm_release.NODE_IMAGE_REPOSITORY, "newTag": __version__}]}))
    return dest / "overlay"


def ca_bundles(node: NodeCluster) -> dict[str, str]:
    """Each webhook's caBundle, by configuration and webhook name."""
    found = {}
    for kind, name in CONFIGS:
        for hook in json.loads(node.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"]:
            found[f"{kind}/{name}/{hook['name']}"] = hook["clientConfig"].get("caBundle", "")
    return found
