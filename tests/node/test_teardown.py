"""A node of its own, with a pod running, stopped: nothing of it is left on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from devtools.node import Node, hierarchies, own_memory_cgroup


def snapshot() -> dict[str, set[str]]:
    """What a node could leave, on the machine: other programs' mounts and links may come and go meanwhile,
    so only the kinds a node makes are compared (its tmpfs, its directories, CNI's names, the bridge)."""
    own = own_memory_cgroup().lstrip("/")
    ours = ("hmw", "hami-mt-node", "/netns/cni-", "containerd", "kubelet")
    return {
        "mounts": {m for m in Path("/proc/self/mounts").read_text().splitlines() if any(o in m for o in ours)},
        "netns": set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()),
        "links": {line.split(":")[1].strip() for line in subprocess.run(
            ["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()},
        "cgroups": {str(d) for h in hierarchies() for d in (h / own).glob("*") if d.is_dir()},
        "processes": {e.name for e in Path("/proc").iterdir() if e.name.isdigit()},
    }


def test_stop_leaves_no_process_mount_cgroup_bridge_or_namespace() -> None:
    before = snapshot()
    node = Node()
    node.start()
    try:
        workdir = node.workdir
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": "default"},
               "spec": {"containers": [{"name": "pause", "image": node.pause, "imagePullPolicy": "Never"}]}}
        node.kubectl("create", "-f", "-", input=json.dumps(pod))
        deadline = time.monotonic() + 60
        while node.kubectl("get", "pod", "holder", "-o", "jsonpath={.status.phase}").stdout != "Running":
            assert time.monotonic() < deadline, "the pod did not start"
            time.sleep(0.25)
        during = snapshot()
        # The node's mounts exist only in its own mount namespace, its cgroups in the machine's hierarchies.
        assert not [m for m in during["mounts"] - before["mounts"] if str(workdir) in m]
        assert during["cgroups"] - before["cgroups"]
        inode = node.ns.inode() if node.ns else 0
    finally:
        node.stop()
    assert node.leftovers() == {"mounts": [], "cgroups": [], "processes": [], "files": []}
    after = snapshot()
    assert after["mounts"] == before["mounts"]
    assert after["netns"] == before["netns"]
    assert not {link for link in after["links"] - before["links"] if link.startswith(("hmw", "veth"))}
    assert after["cgroups"] <= before["cgroups"]
    new = after["processes"] - before["processes"]
    ours = [p for p in new if _in_netns(p, inode) or str(workdir) in _cmdline(p)]
    assert ours == []
    assert not workdir.exists()


def _in_netns(pid: str, inode: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == inode
    except OSError:
        return False


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""
