"""The node itself: Ready, its addresses only inside its namespace, a pod of the pause image running."""

from __future__ import annotations

import json
import subprocess
import time

from devtools import pki
from devtools.node import BRIDGE, NODE_IP, NODE_NAME, Node


def test_node_is_ready_at_its_own_address(node: Node) -> None:
    got = json.loads(node.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    ready = [c["status"] for c in got["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"]
    assert {"type": "InternalIP", "address": NODE_IP} in got["status"]["addresses"]
    assert got["status"]["nodeInfo"]["kubeletVersion"] == node.controlplane.git_version
    assert got["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_addresses_exist_only_inside(node: Node) -> None:
    """The bridge, the node IP and the cluster IP are in the tier's namespace and nowhere else."""
    inside = node.inside("ip", "-o", "-4", "addr").stdout
    assert f"{NODE_IP}/24" in next(line for line in inside.splitlines() if f" {BRIDGE} " in line)
    assert f"{pki.SERVICE_IP}/32" in inside
    outside = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    assert NODE_IP not in outside and BRIDGE not in outside
    routes = node.inside("ip", "route").stdout
    assert "default" not in routes  # nothing leads out of the namespace


def test_a_pod_of_the_pause_image_runs(node: Node) -> None:
    """The sandbox image and the import path work on their own: a pod of the pause image is Running."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pause", "namespace": "default"},
           "spec": {"containers": [{"name": "pause", "image": node.pause, "imagePullPolicy": "Never"}],
                    "terminationGracePeriodSeconds": 1}}
    node.kubectl("create", "-f", "-", input=json.dumps(pod))
    try:
        deadline = time.monotonic() + 60
        phase = ""
        while phase != "Running" and time.monotonic() < deadline:
            time.sleep(0.25)
            phase = node.kubectl("get", "pod", "pause", "-o", "jsonpath={.status.phase}").stdout
        assert phase == "Running"
        ip = node.kubectl("get", "pod", "pause", "-o", "jsonpath={.status.podIP}").stdout
        assert ip.startswith("10.244.0.")
    finally:
        node.kubectl("delete", "pod", "pause", "--wait=true", "--timeout=30s", check=False)
