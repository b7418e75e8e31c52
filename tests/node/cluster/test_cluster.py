"""Three real nodes, each a machine of its own, and the faults that happen to machines and to pods.

The cluster (`devtools.clusters.nodes.NodeCluster`) and the chart on it serve this module only: it is torn down before
the one-node tier starts (this directory is collected before the tier's other modules), so the machine
never runs both. The faults are checked for what they are meant to do, at the kernel's level and as the
API server sees it; what a fault costs the webhook is measured elsewhere, with the same methods.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.builds.binaries import ControlPlaneError
from devtools.clusters import helm_release
from devtools.clusters.host import ZONE_LABEL, process_state
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread, creating
from devtools.waiting import until
from tests.node.pods import connect, in_pod, pause_pod

from ..conftest import MEASURED, NAMESPACE

GPU_NODE = "mthreads.com/gpu-node"
@pytest.fixture(scope="module")
def cluster() -> Iterator[NodeCluster]:
    c = NodeCluster(3, labels=[{}, {}, {GPU_NODE: "true"}])
    try:
        try:
            c.start()
            MEASURED.append(f"3 nodes Ready {c.startup_seconds:.1f} s after the start (control plane and image "
                            f"imports included), {c.kubelet_ready_seconds:.1f} s after the kubelets started")
            seconds = helm_release.install(c)
        except (ControlPlaneError, RuntimeError) as e:
            pytest.fail(f"the cluster did not start:\n{e}", pytrace=False)
        MEASURED.append(f"3 nodes: helm install to 3 replicas Ready: {seconds:.1f} s")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


def replicas(c: NodeCluster) -> dict[str, dict[str, Any]]:
    """The chart's pods by node, those being deleted left out."""
    out = c.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=hami-mt-webhook", "-o", "json")
    pods = [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]
    return {p["spec"]["nodeName"]: p for p in pods}


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def fabric(c: NodeCluster) -> list[str]:
    assert c.fabric is not None
    return c.fabric.prefix


def test_three_nodes_ready_each_in_its_zone(cluster: NodeCluster) -> None:
    nodes = cluster.nodes()
    assert sorted(nodes) == ["hmw-node-1", "hmw-node-2", "hmw-node-3"]
    assert [nodes[n]["metadata"]["labels"][ZONE_LABEL] for n in sorted(nodes)] == ["zone-a", "zone-b", "zone-c"]
    assert [n for n in sorted(nodes) if nodes[n]["metadata"]["labels"].get(GPU_NODE) == "true"] == ["hmw-node-3"]
    for host in cluster.hosts:
        assert cluster.ready_status(host.name) == "True"
        assert {"type": "InternalIP", "address": host.ip} in nodes[host.name]["status"]["addresses"]


def test_one_replica_per_node_each_reached_by_the_api_server(cluster: NodeCluster) -> None:
    placed = replicas(cluster)
    assert sorted(placed) == cluster.names and all(ready(p) for p in placed.values())
    for node, pod in placed.items():
        assert pod["status"]["podIP"].startswith(cluster.host(node).subnet.removesuffix("0/24"))
        name = pod["metadata"]["name"]
        metrics = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}:9090/proxy/metrics")
        assert "hami_mt_webhook" in metrics.stdout


def test_a_pod_on_node_1_reaches_a_pod_on_node_3_by_ip(cluster: NodeCluster) -> None:
    placed = replicas(cluster)
    source = placed["hmw-node-1"]["metadata"]["name"]
    target = placed["hmw-node-3"]["status"]["podIP"]
    assert connect(in_pod(cluster, NAMESPACE, source), target, 9090) == "connected"
    assert connect(in_pod(cluster, NAMESPACE, source), target, 1) == "refused"  # its kernel answers


def test_freeze_and_thaw_a_container(cluster: NodeCluster) -> None:
    name = pause_pod(cluster, "frozen", "hmw-node-1")
    pids = cluster.freeze_pod("default", name)
    assert pids and all(process_state(p) == "T" for p in pids)
    cluster.thaw_pod("default", name)
    assert all(process_state(p) in "RS" for p in pids)


def test_a_killed_container_is_restarted_by_kubelet(cluster: NodeCluster) -> None:
    name = pause_pod(cluster, "killed", "hmw-node-2")
    cluster.kill_pod("default", name)
    status = until("the container restarted", lambda: (s := cluster.container_status("default", name))
                   .get("restartCount") and s["state"].get("running") and s, 60)
    assert status["lastState"]["terminated"]["exitCode"] == 137


def test_an_oom_kill_under_the_container_limit_is_reported_as_oomkilled(cluster: NodeCluster) -> None:
    name = pause_pod(cluster, "oom", "hmw-node-2")
    terminated = cluster.oom_kill_pod("default", name)
    assert terminated["reason"] == "OOMKilled", terminated
    assert terminated["exitCode"] == 137


def test_a_cut_pod_is_silent_both_ways_until_restored(cluster: NodeCluster) -> None:
    pod = replicas(cluster)["hmw-node-2"]
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    other = in_pod(cluster, NAMESPACE, replicas(cluster)["hmw-node-1"]["metadata"]["name"])
    cluster.cut_pod(NAMESPACE, name)
    try:
        for prefix in (fabric(cluster), other):
            assert connect(prefix, ip, 9090) == "timeout"
            assert connect(prefix, ip, 1) == "timeout"  # no RST: nothing reaches its kernel
        assert connect(in_pod(cluster, NAMESPACE, name), cluster.host("hmw-node-2").ip, 10250) == "timeout"
    finally:
        cluster.restore_pod(NAMESPACE, name)
    until("the restored pod answers", lambda: connect(fabric(cluster), ip, 9090) == "connected", 30)


def test_restarting_kubelet_and_containerd_keeps_the_pods_running(cluster: NodeCluster) -> None:
    before = cluster.container_status("default", "frozen")
    host = cluster.host("hmw-node-1")
    old = (host.kubelet.pid if host.kubelet else 0, host.containerd.pid if host.containerd else 0)
    cluster.restart_containerd("hmw-node-1")
    cluster.restart_kubelet("hmw-node-1")
    assert host.kubelet is not None and host.containerd is not None
    assert (host.kubelet.pid, host.containerd.pid) != old and old[0] and old[1]
    assert host.kubelet.poll() is None and host.containerd.poll() is None
    assert cluster.ready_status("hmw-node-1") == "True"
    after = cluster.container_status("default", "frozen")
    assert (after["containerID"], after["restartCount"]) == (before["containerID"], before["restartCount"])
    assert after["state"].get("running")


def test_a_killed_node_goes_silent_without_a_goodbye_and_comes_back(cluster: NodeCluster, lt: LoopThread) -> None:
    name = "hmw-node-3"
    host = cluster.host(name)
    pod = replicas(cluster)[name]
    ip = pod["status"]["podIP"]
    assert connect(fabric(cluster), ip, 1) == "refused"  # alive, a closed port is answered
    with creating(cluster.controlplane, lt, "kill-node", rate=5, seconds=12) as creator:
        time.sleep(2)
        processes = host.processes()
        assert host.kubelet is not None and host.containerd is not None
        assert {host.kubelet.pid, host.containerd.pid} < processes  # and the shims, and the pods' processes
        started = time.monotonic()
        cluster.kill_node(name)
        killed = time.monotonic() - started
        killed_at = time.time()
        assert host.processes() == set()
        assert all(process_state(p) == "Z" for p in processes)  # gone, or dead and not yet reaped
        assert cluster.ready_status(name) == "True"  # no goodbye: the API server still has it Ready
        for port in (9090, 1):
            assert connect(fabric(cluster), ip, port) == "timeout"  # no RST, no ICMP
        assert connect(fabric(cluster), host.ip, 10250) == "timeout"  # kubelet's port
    outcomes = creator.outcomes
    assert len(outcomes) == 60 and all(o.sent and o.took >= 0 for o in outcomes)
    MEASURED.append(f"kill_node: {len(processes)} processes SIGKILLed in {killed:.2f} s; slice pods meanwhile: "
                    f"{sum(o.status == 201 for o in outcomes)}/60 created")
    started = time.monotonic()
    cluster.revive_node(name)
    MEASURED.append(f"revive_node: Ready again {time.monotonic() - started:.1f} s later")
    assert cluster.lease_renewed(name) > killed_at
    until("the replica on the revived node Ready", lambda: ready(replicas(cluster).get(name, {"status": {}})), 120)


def test_stop_after_a_kill_and_a_revive_leaves_nothing(cluster: NodeCluster) -> None:
    workdir = cluster.workdir
    cluster.stop()
    assert cluster.leftovers() == {"mounts": [], "cgroups": [], "processes": [], "files": []}
    assert not workdir.exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "hmw" not in links

