"""Where the chart places the webhook's replicas: spread over nodes and zones, off GPU nodes when it can.

The pod webhooks fail closed, and GPU nodes are the ones that go down most (driver faults, kernel panics,
driver upgrades), so a replica on a GPU node is a replica likely to be lost. The rendering is checked with
helm template; the placement itself on kube-scheduler, which binds the chart's pods to Node objects that
no kubelet runs (the pods are never started, which placement does not need).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import apply_nodes
from devtools.gpus import HOSTNAME, S5000, ZONES
from devtools.waiting import until

from .support import running
from .test_chart import CHART, NS, RELEASE, Doc, find, helm, template
from .test_controllers import get

ZONE = "topology.kubernetes.io/zone"
GPU_KEYS = ["mthreads.com/gpu-node", "mthreads.com/gpu.count", "gpu", "nvidia.com/gpu.present"]
SELECTOR = {"matchLabels": {"app.kubernetes.io/name": "hami-mt-webhook"}}


def pod_spec(docs: list[Doc]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]
    return spec


def spread(docs: list[Doc]) -> dict[str, dict[str, Any]]:
    return {c["topologyKey"]: c for c in pod_spec(docs).get("topologySpreadConstraints", [])}


def preferred_nodes(docs: list[Doc]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = pod_spec(docs)["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    return terms


# --- rendering ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return template()


def test_defaults_spread_over_nodes_and_zones_and_prefer_nodes_without_gpus(rendered: list[Doc]) -> None:
    constraints = spread(rendered)
    assert list(constraints) == ["kubernetes.io/hostname", ZONE]
    assert constraints["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert constraints[ZONE]["whenUnsatisfiable"] == "ScheduleAnyway"  # a single-zone cluster still schedules
    for c in constraints.values():
        assert c["maxSkew"] == 1 and c["labelSelector"] == SELECTOR and c["nodeTaintsPolicy"] == "Honor"
        assert c["matchLabelKeys"] == ["pod-template-hash"]  # a rollout's surge pod counts its own ReplicaSet
    (term,) = preferred_nodes(rendered)
    assert term == {"weight": 100, "preference": {"matchExpressions": [
        {"key": key, "operator": "DoesNotExist"} for key in GPU_KEYS]}}
    # The spread replaces the pod anti-affinity; a required node affinity is the user's alone.
    assert set(pod_spec(rendered)["affinity"]) == {"nodeAffinity"}
    assert set(pod_spec(rendered)["affinity"]["nodeAffinity"]) == {"preferredDuringSchedulingIgnoredDuringExecution"}


def test_each_spread_is_tunable_and_can_be_switched_off() -> None:
    docs = template("--set", "topologySpread.hostname.whenUnsatisfiable=ScheduleAnyway",
                    "--set", "topologySpread.hostname.maxSkew=2", "--set", "topologySpread.zone.maxSkew=3",
                    "--set", "topologySpread.zone.whenUnsatisfiable=DoNotSchedule")
    got = {key: (c["maxSkew"], c["whenUnsatisfiable"]) for key, c in spread(docs).items()}
    assert got == {"kubernetes.io/hostname": (2, "ScheduleAnyway"), ZONE: (3, "DoNotSchedule")}
    assert list(spread(template("--set", "topologySpread.zone.enabled=false"))) == ["kubernetes.io/hostname"]
    assert list(spread(template("--set", "topologySpread.hostname.enabled=false"))) == [ZONE]
    off = template("--set", "topologySpread.hostname.enabled=false", "--set", "topologySpread.zone.enabled=false")
    assert "topologySpreadConstraints" not in pod_spec(off)


def test_the_gpu_preference_is_tunable_and_can_be_switched_off() -> None:
    docs = template("--set", "avoidGpuNodes.weight=30", "--set", "avoidGpuNodes.labelKeys={example.com/accelerator}")
    assert preferred_nodes(docs) == [{"weight": 30, "preference": {"matchExpressions": [
        {"key": "example.com/accelerator", "operator": "DoesNotExist"}]}}]
    assert "affinity" not in pod_spec(template("--set", "avoidGpuNodes.enabled=false"))
    assert "affinity" not in pod_spec(template("--set", "avoidGpuNodes.labelKeys=null"))


def test_user_placement_values_merge_with_the_charts_terms(tmp_path: Path) -> None:
    """The user's affinity keeps every term, the chart's are appended; nodeSelector and tolerations pass."""
    infra = {"matchExpressions": [{"key": "node-role.kubernetes.io/infra", "operator": "Exists"}]}
    ssd = {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
    apart = {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "ingress"}}}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [infra]},
                                      "preferredDuringSchedulingIgnoredDuringExecution": [ssd]},
                     "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [apart]}},
        "antiAffinity": "hard",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "node-role.kubernetes.io/infra", "operator": "Exists", "effect": "NoSchedule"}],
    }))
    spec = pod_spec(template("-f", str(values)))
    node = spec["affinity"]["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": [infra]}
    assert [t["weight"] for t in node["preferredDuringSchedulingIgnoredDuringExecution"]] == [10, 100]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"][0] == ssd
    ours = {"topologyKey": "kubernetes.io/hostname", "labelSelector": SELECTOR}
    assert spec["affinity"]["podAntiAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": [apart, ours]}
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"][0]["key"] == "node-role.kubernetes.io/infra"
    assert len(spec["topologySpreadConstraints"]) == 2
    # antiAffinity=soft, as values files written before the spread say it, renders what it always did.
    soft = pod_spec(template("--set", "antiAffinity=soft"))["affinity"]["podAntiAffinity"]
    assert soft == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": ours}]}


# --- on kube-scheduler -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of our own whose kube-scheduler answers to default-scheduler (the chart's pods name
    no scheduler), with the release namespace made as the README says."""
    cp = ControlPlane(workdir=tmp_path_factory.mktemp("placement-cp"), controllers=True, default_scheduler=True)
    with running(cp, "the placement test's control plane"):
        cp.kubectl("create", "namespace", NS)
        cp.kubectl("label", "namespace", NS, "hami.io/webhook=ignore", "pod-security.kubernetes.io/enforce=restricted")
        yield cp


def gpu_node(name: str, zone: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An S5000 node as a GPU cluster labels it (operator, device plugin, cloud zone), or with `labels`."""
    return S5000.node(name, labels if labels is not None else S5000.datacenter_labels(name, zone))


def cpu_node(name: str, zone: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {HOSTNAME: name, ZONE: zone, "kubernetes.io/os": "linux"}},
            "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}


def replicas(cp: ControlPlane, count: int = 3, gone: frozenset[str] = frozenset()) -> dict[str, str]:
    """Wait until `count` replicas, none named in `gone`, are all bound; pod name -> node name."""
    def probe() -> dict[str, str] | None:
        pods = get(cp, "pods", "-n", NS, "-l", "app.kubernetes.io/name=hami-mt-webhook")["items"]
        bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods
                 if p["metadata"]["name"] not in gone and "deletionTimestamp" not in p["metadata"]}
        return bound if len(bound) == count and all(bound.values()) else None
    placed: dict[str, str] = until(f"{count} replicas bound", probe, timeout=60)
    return placed


def reschedule(cp: ControlPlane) -> dict[str, str]:
    """The replicas lost, as their nodes failing would lose them, and placed again by the ReplicaSet and
    kube-scheduler; pod name -> node name of the replacements."""
    before = replicas(cp)
    # No kubelet confirms a deletion here: remove them at once.
    cp.kubectl("delete", "pods", "-n", NS, *before, "--grace-period=0", "--force")
    start = time.monotonic()
    placed = replicas(cp, gone=frozenset(before))
    print(f"3 replacements bound {time.monotonic() - start:.1f} s after the deletion")
    return placed


def zones_of(cp: ControlPlane, nodes: list[str]) -> list[str]:
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in get(cp, "nodes")["items"]}
    return [labels[n][ZONE] for n in nodes]


class TestOnTheScheduler:
    """In this order: 3 zones of GPU nodes and the chart installed with its defaults; then nodes without
    GPUs join; then one zone with a single node without GPUs. Each time the replicas are placed anew."""

    GPU = {f"gpu-{zone[-1]}{i}": zone for zone in ZONES for i in (1, 2)}
    # Two in the first zone, so the zone spread is what keeps two replicas from sharing it.
    CPU = {"cpu-a1": ZONES[0], "cpu-a2": ZONES[0], "cpu-b1": ZONES[1], "cpu-c1": ZONES[2]}

    def test_with_only_gpu_nodes_every_replica_is_still_placed_apart(self, cluster: ControlPlane) -> None:
        nodes = [gpu_node(name, zone) for name, zone in self.GPU.items()]
        # HAMi's own device plugin's label alone marks a GPU node too.
        nodes[-1] = gpu_node("gpu-c2", ZONES[2], {HOSTNAME: "gpu-c2", ZONE: ZONES[2], "gpu": "on"})
        apply_nodes(cluster, nodes)
        start = time.monotonic()
        helm("install", RELEASE, str(CHART), "--namespace", NS, kubeconfig=cluster.kubeconfig)
        placed = replicas(cluster)
        print(f"3 replicas bound {time.monotonic() - start:.1f} s after helm install")
        assert set(placed.values()) <= set(self.GPU)
        assert len(set(placed.values())) == 3, placed
        assert sorted(zones_of(cluster, list(placed.values()))) == sorted(ZONES), placed

    def test_nodes_without_gpus_take_the_replicas_one_per_zone(self, cluster: ControlPlane) -> None:
        apply_nodes(cluster, [cpu_node(name, zone) for name, zone in self.CPU.items()])
        placed = reschedule(cluster)
        assert set(placed.values()) <= set(self.CPU), placed
        assert len(set(placed.values())) == 3, placed
        assert sorted(zones_of(cluster, list(placed.values()))) == sorted(ZONES), placed

    def test_one_node_without_gpus_in_one_zone_does_not_take_them_all(self, cluster: ControlPlane) -> None:
        """A single-zone GPU cluster with one small management node: the GPU preference alone would stack
        every replica there; the spread by node gives it one and the others to two GPU nodes."""
        kept = "cpu-a1"
        cluster.kubectl("delete", "nodes", *(n for n in self.CPU if n != kept))
        cluster.kubectl("label", "nodes", "--all", f"{ZONE}=single", "--overwrite")
        placed = list(reschedule(cluster).values())
        assert placed.count(kept) == 1 and len(set(placed)) == 3, placed
