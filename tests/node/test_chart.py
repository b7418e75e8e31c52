"""The chart as users install it, on the real node: 3 replicas Ready through their probes, and
kube-apiserver calling them through the Service's endpoints."""

from __future__ import annotations

import json

from devtools.clusters import helm_release
from devtools.clusters.nodes import NodeCluster

from .conftest import MEASURED, NAMESPACE

SLICE_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice"},
             "spec": {"containers": [{"name": "main", "image": "example.invalid/train:1", "resources": {
                 "limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
                            "mthreads.com/sgpu-core": "8"}}}]}}


def test_three_replicas_ready_behind_the_service(chart: NodeCluster) -> None:
    pods = json.loads(chart.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    running = [p for p in pods if p["status"]["phase"] == "Running"]
    assert len(running) == 3
    for pod in running:
        ready = [c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], pod["metadata"]["name"]
        assert pod["spec"]["containers"][0]["image"].startswith("localhost/hami-mt-webhook:")
        assert pod["spec"]["nodeName"] == chart.names[0]
    slices = json.loads(chart.kubectl("get", "endpointslices", "-n", NAMESPACE, "-l",
                                      f"kubernetes.io/service-name={helm_release.RELEASE}", "-o", "json").stdout)
    addresses = {a for s in slices["items"] for e in s.get("endpoints") or []
                 if (e.get("conditions") or {}).get("ready") for a in e["addresses"]}
    assert addresses == {p["status"]["podIP"] for p in running}


def test_replica_memory(chart: NodeCluster) -> None:
    """Each replica's working set, from kubelet's summary: more than nothing, within the chart's limit."""
    memory = chart.pod_memory(NAMESPACE)
    assert len(memory) == 3
    for name, used in sorted(memory.items()):
        MEASURED.append(f"replica {name}: {used / 2**20:.1f} MiB working set")
        assert 0 < used < 256 * 2**20


def test_slice_pod_is_mutated_through_the_service(chart: NodeCluster) -> None:
    chart.kubectl("create", "namespace", "team-node")
    try:
        done = chart.kubectl("create", "-n", "team-node", "-f", "-", "-o", "json", input=json.dumps(SLICE_POD))
        pod = json.loads(done.stdout)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
        metrics = "".join(
            chart.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}:9090/proxy/metrics",
                          check=False).stdout
            for name in chart.pod_memory(NAMESPACE))
        assert "hami_mt_webhook" in metrics
    finally:  # bound to an example node, where no kubelet confirms a graceful deletion
        chart.kubectl("delete", "pod", "slice", "-n", "team-node", "--grace-period=0", "--force", check=False)
        chart.kubectl("delete", "namespace", "team-node", "--wait=false", check=False)
