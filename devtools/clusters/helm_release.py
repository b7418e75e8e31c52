"""The chart as a Helm release on a cluster of real nodes: installed as the README's Install section says, its
replicas and their metrics, the example nodes it is tried on. One home for the node, fault, cert-manager and
release tiers, `make run NODE=1` and the scenarios."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from devtools import gpus
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.nodes import NodeCluster
from devtools.paths import CHART
from devtools.waiting import NotWithin, until

NAMESPACE = "hami-mt-webhook"


SERVICE_ACCOUNT = "hami-mt-webhook"


#: The chart, and the release name the README's Helm section installs it under.
RELEASE = "hami-mt-webhook"


def helm(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """The built helm against the local control plane, its cache and config kept in the run directory."""
    home = cp.workdir / "helm"
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    done = subprocess.run([str(cp.bin_dir / "helm"), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done


def apply_nodes(cp: ControlPlane, nodes: Iterable[dict[str, Any]]) -> list[str]:
    """Create Node objects (metadata, and spec such as taints) and set their capacity through the status
    subresource, as kubelet would."""
    names = []
    for node in nodes:
        meta = {k: v for k, v in node["metadata"].items() if k in ("name", "labels")}
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        if node.get("spec"):
            obj["spec"] = node["spec"]
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
        capacity = (node.get("status") or {}).get("capacity") or {}
        status = {"status": {"capacity": capacity, "allocatable": capacity}}
        cp.kubectl("patch", "node", meta["name"], "--subresource=status", "--type=merge", "-p",
                   yaml.safe_dump(status))
        names.append(meta["name"])
    return names


def example_nodes() -> list[dict[str, Any]]:
    """The example S4000 and S5000 nodes (examples/nodes.yaml), and a node with whole cards only."""
    return [*gpus.example_nodes(), gpus.whole_card_node()]


#: The taint on the example nodes beside a real one: no kubelet runs them.
NO_KUBELET = "hami-mt.example/no-kubelet"


#: The chart's image as containerd names the image `make image` built and the node imported.
NODE_IMAGE_REPOSITORY = "localhost/hami-mt-webhook"


REPLICAS = 3


def tainted_example_nodes() -> list[dict[str, Any]]:
    """The example nodes, as Node objects beside the real one: capacity for the webhook to read. No kubelet
    runs them, so a NoSchedule taint keeps every pod that does not ask for them (the chart's) off them."""
    nodes = example_nodes()
    for n in nodes:
        spec = n.setdefault("spec", {})
        spec["taints"] = [*(spec.get("taints") or []), {"key": NO_KUBELET, "effect": "NoSchedule"}]
    return nodes


def replicas(cluster: NodeCluster, *, terminating: bool = False) -> list[dict[str, Any]]:
    """The chart's webhook pods; those being deleted (still serving through their preStop) only if asked."""
    pods = cluster.controlplane.get(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                    labelSelector="app.kubernetes.io/name=hami-mt-webhook")
    return [p for p in pods["items"] if terminating or not p["metadata"].get("deletionTimestamp")]


def scrape(cluster: NodeCluster, pod: dict[str, Any]) -> str:
    """A replica's metrics, through the API server's pod proxy ("" when it does not answer)."""
    return cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}:9090"
                           "/proxy/metrics", check=False).stdout


def ready_replicas(cluster: NodeCluster) -> int:
    out = cluster.kubectl("get", "deployment", RELEASE, "-n", NAMESPACE, "-o",
                          "jsonpath={.status.readyReplicas}", check=False).stdout.strip()
    return int(out or 0)


def install(cluster: NodeCluster, timeout: float = 180.0, values: Sequence[str] = (),
            chart: Sequence[str] | None = None) -> float:
    """The chart installed on real nodes as the README's Install section says, with its defaults (and
    `values`, `key=value` for `--set`): the namespace made and labelled, the tainted example nodes,
    `helm install`, and the wait for its replicas Ready through their probes. One home for the node tier,
    the release tier and `make run NODE=1`/`NODES=3`; returns the seconds from `helm install` to Ready.

    `chart` is what `helm install` takes after the release name (e.g. `oci://…`, `--version`, `--plain-http`);
    by default this tree's chart with the image built here."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "hami.io/webhook=ignore",
                    "pod-security.kubernetes.io/enforce=restricted")
    apply_nodes(cluster.controlplane, tainted_example_nodes())
    started = time.monotonic()
    source = chart if chart is not None else [str(CHART), "--set", f"image.repository={NODE_IMAGE_REPOSITORY}"]
    helm(cluster.controlplane, "install", RELEASE, *source, "-n", NAMESPACE,
         *(a for v in values for a in ("--set", v)))

    def not_ready(_: str) -> NotWithin:
        pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout
        events = cluster.kubectl("get", "events", "-n", NAMESPACE).stdout[-4000:]
        return NotWithin(f"{REPLICAS} replicas not Ready {timeout:.0f} s after helm install:\n{pods}\n{events}")

    # the deadline counts from `helm install`, as the figure returned does
    until(f"{REPLICAS} replicas Ready", lambda: ready_replicas(cluster) == REPLICAS,
          started + timeout - time.monotonic(), 0.25, fail=not_ready)
    return time.monotonic() - started
