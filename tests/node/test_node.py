"""The node itself: Ready, its addresses only inside the tier's namespaces, a pod of the pause image running."""

from __future__ import annotations

import json
import subprocess

from devtools import pki
from devtools.clusters.host import BRIDGE, FABRIC_IP, UPLINK
from devtools.clusters.nodes import NodeCluster

from ..e2e.support import until_seen


def test_node_is_ready_at_its_own_address(node: NodeCluster) -> None:
    host = node.hosts[0]
    got = json.loads(node.kubectl("get", "node", host.name, "-o", "json").stdout)
    ready = [c["status"] for c in got["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"]
    assert {"type": "InternalIP", "address": host.ip} in got["status"]["addresses"]
    assert got["status"]["nodeInfo"]["kubeletVersion"] == node.controlplane.git_version
    assert got["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert got["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-a"


def test_addresses_exist_only_inside(node: NodeCluster) -> None:
    """The bridge and the node IP are in the node's namespace, the cluster IP and the control plane's address
    in the fabric's, and nowhere else; no route leads out of either."""
    host = node.hosts[0]
    inside = host.inside("ip", "-o", "-4", "addr").stdout
    assert f"{host.ip}/24" in next(line for line in inside.splitlines() if f" {BRIDGE} " in line)
    fabric = node.in_fabric("ip", "-o", "-4", "addr").stdout
    assert f"{pki.SERVICE_IP}/32" in fabric and f"{FABRIC_IP}/32" in fabric
    outside = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    assert host.ip not in outside and FABRIC_IP not in outside and BRIDGE not in outside
    for routes in (host.inside("ip", "route").stdout, node.in_fabric("ip", "route").stdout):
        assert "default" not in routes
    assert f"{pki.SERVICE_CIDR} via {FABRIC_IP} dev {UPLINK}" in host.inside("ip", "route").stdout


def test_a_pod_of_the_pause_image_runs(node: NodeCluster) -> None:
    """The sandbox image and the import path work on their own: a pod of the pause image is Running."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pause", "namespace": "default"},
           "spec": {"containers": [{"name": "pause", "image": node.pause, "imagePullPolicy": "Never"}],
                    "terminationGracePeriodSeconds": 1}}
    node.kubectl("create", "-f", "-", input=json.dumps(pod))
    try:
        until_seen("the pause pod Running", lambda: node.kubectl("get", "pod", "pause", "-o",
                                                                "jsonpath={.status.phase}").stdout,
                   lambda phase: phase == "Running", 60, 0.25)
        ip = node.kubectl("get", "pod", "pause", "-o", "jsonpath={.status.podIP}").stdout
        assert ip.startswith("10.244.1.")
    finally:
        node.kubectl("delete", "pod", "pause", "--wait=true", "--timeout=30s", check=False)
