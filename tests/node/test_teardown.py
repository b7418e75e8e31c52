"""A node of its own, with a pod running, stopped or killed: nothing of it is left on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devtools.clusters.host import hierarchies
from devtools.clusters.nodes import NodeCluster
from devtools.paths import REPO_ROOT

from ..e2e.support import until_seen


def snapshot() -> dict[str, set[str]]:
    """What a node could leave, on the machine: other programs' mounts and links may come and go meanwhile,
    so only the kinds a node makes are compared (its tmpfs, its directories, CNI's names, the bridge). Its
    cgroups are looked at under its own root (`node_cgroups`): other tiers' nodes make theirs meanwhile."""
    ours = ("hmw", "hami-mt-node", "/netns/cni-", "containerd", "kubelet")
    return {
        "mounts": {m for m in Path("/proc/self/mounts").read_text().splitlines() if any(o in m for o in ours)},
        "netns": set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()),
        "links": {line.split(":")[1].strip() for line in subprocess.run(
            ["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()},
        "processes": {e.name for e in Path("/proc").iterdir() if e.name.isdigit()},
    }


def node_cgroups(node: NodeCluster) -> list[Path]:
    """The cgroups under the node's own root, in every hierarchy."""
    roots = [h / node.cgroup_root.lstrip("/") for h in hierarchies(unified=True)] if node.cgroup_root else []
    return [d for root in roots if root.is_dir() for d in (root, *root.rglob("*")) if d.is_dir()]


def test_stop_leaves_no_process_mount_cgroup_bridge_or_namespace() -> None:
    before = snapshot()
    node = NodeCluster(1, images=())
    node.start()
    try:
        workdir = node.workdir
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": "default"},
               "spec": {"containers": [{"name": "pause", "image": node.pause, "imagePullPolicy": "Never"}]}}
        node.kubectl("create", "-f", "-", input=json.dumps(pod))
        until_seen("the holder pod Running", lambda: node.kubectl("get", "pod", "holder", "-o",
                                                                 "jsonpath={.status.phase}").stdout,
                   lambda phase: phase == "Running", 60, 0.25)
        during = snapshot()
        # The node's mounts exist only in its own mount namespace, its cgroups in the machine's hierarchies.
        assert not [m for m in during["mounts"] - before["mounts"] if str(workdir) in m]
        assert [d for d in node_cgroups(node) if d.name.startswith("pod")]
        inodes = {h.netns_inode for h in node.hosts}
    finally:
        node.stop()
    assert node.leftovers() == {"mounts": [], "cgroups": [], "processes": [], "files": []}
    after = snapshot()
    assert after["mounts"] == before["mounts"]
    assert after["netns"] == before["netns"]
    assert not {link for link in after["links"] - before["links"] if link.startswith(("hmw", "veth"))}
    assert node_cgroups(node) == []
    new = after["processes"] - before["processes"]
    ours = [p for p in new if any(_in_netns(p, i) for i in inodes) or str(workdir) in _cmdline(p)]
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


KILLED_RUN = """
import json, time
from devtools.clusters.nodes import NodeCluster
from devtools.waiting import until
node = NodeCluster(2, images=())
node.start()
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": "default"},
       "spec": {"containers": [{"name": "pause", "image": node.pause, "imagePullPolicy": "Never"}]}}
node.kubectl("create", "-f", "-", input=json.dumps(pod))
until("the holder pod Running", lambda: node.kubectl("get", "pod", "holder", "-o",
                                                    "jsonpath={.status.phase}").stdout == "Running", 60, 0.25)
dirs = [str(d) for h in node.hosts for d in h.cgroup_dirs()]
inodes = [node.fabric_inode, *(h.netns_inode for h in node.hosts)]
print(json.dumps({"workdir": str(node.workdir), "inodes": inodes, "cgroups": dirs}), flush=True)
time.sleep(600)
"""


def test_a_killed_run_leaves_nothing_either() -> None:
    """SIGKILL the process that started two nodes with a pod running: kubelets, containerds and the control
    plane die with it, and the namespaces' holders stop the containers and shims, remove the cgroups and the
    work dir (the fabric's holder last, once the nodes' have stopped)."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        started = json.loads(line)
    finally:
        proc.kill()
        proc.wait()
    workdir, inodes = Path(started["workdir"]), started["inodes"]
    assert [Path(d).is_dir() for d in started["cgroups"]] and workdir.is_dir()
    until_seen("the work dir, the cgroups and the namespaces' processes gone", lambda: (
        workdir.exists(), [d for d in started["cgroups"] if Path(d).exists()], _netns_pids(*inodes)),
        lambda left: not any(left), 30, 0.2)


def _netns_pids(*inodes: int) -> list[str]:
    return [e.name for e in Path("/proc").iterdir() if e.name.isdigit() and any(_in_netns(e.name, i) for i in inodes)]
