"""Pods on the node tier's nodes, and connections from inside them: what the cluster tests and the fault tier's
lockdown tests reach replicas with."""

from __future__ import annotations

import json
import subprocess
import sys

from devtools.clusters.nodes import NodeCluster
from devtools.waiting import until

#: A TCP connect's outcome, printed by a Python run where the caller says (`connect`).
CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except TimeoutError:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print(f"error {e.strerror}")
"""


def connect(prefix: list[str], ip: str, port: int, timeout: float = 2.0) -> str:
    """A TCP connect to ip:port from where `prefix` enters: connected, refused, timeout or an error."""
    done = subprocess.run([*prefix, sys.executable, "-c", CONNECT, ip, str(port), str(timeout)],
                          capture_output=True, text=True, timeout=timeout + 30, check=True)
    return done.stdout.strip()


def in_pod(c: NodeCluster, namespace: str, name: str) -> list[str]:
    return ["nsenter", f"--net=/proc/{min(c.container_processes(namespace, name))}/ns/net", "--"]


def pause_pod(c: NodeCluster, name: str, node: str, namespace: str = "default") -> str:
    """A pod of the pause image on `node`, with a memory limit, Running; returns its name."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "pause", "image": c.pause, "imagePullPolicy": "Never",
                                    "resources": {"limits": {"memory": "64Mi"}}}]}}
    c.kubectl("create", "-f", "-", input=json.dumps(pod))
    until(f"pod {name} running", lambda: c.container_status(namespace, name).get("state", {}).get("running"), 60)
    return name
