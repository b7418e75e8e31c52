"""`make run NODE=1` as a user meets it: the printed hint reaches the chart's 3 replicas on the real node,
a slice pod comes back mutated, and Ctrl-C leaves nothing of the node behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from devtools.clusters import helm_release
from devtools.clusters.host import hierarchies, leftovers, own_memory_cgroup
from tests.e2e.support import found

from ..e2e.support import processes_mentioning, until_seen
from ..e2e.test_try import BANNER_END, Run
from .test_chart import SLICE_POD


def netns_inode(workdir: Path) -> int:
    """The network namespace of the node's kubelet (a process naming the node's work dir in its flags)."""
    for pid in processes_mentioning(workdir / "node1" / "kubelet.yaml"):
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    raise AssertionError(f"no kubelet of {workdir} running")


def test_make_run_on_the_node_serves_from_the_replicas_and_leaves_nothing() -> None:
    # A short base: containerd's sockets live in the node's work dir, and a unix socket path has 104 bytes.
    base = Path(tempfile.mkdtemp(prefix="hmw-run-"))
    run = Run(base / "run", extra=("--node",))  # the node implies the chart: --install is moot
    try:
        banner = run.until(BANNER_END, timeout=600)
        kubeconfig = Path(found(r"export KUBECONFIG=(\S+)", banner))
        kubectl = found(r"alias kubectl=(\S+)", banner)
        assert re.search(r"alias helm=\S+/helm\b", banner)
        assert "no local process to kill or restart" in banner
        workdir = next(p for p in kubeconfig.parents if p.parent == run.dir)  # the node's own directory
        inode = netns_inode(workdir)

        def k(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
            done = subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", *args], input=input,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done

        ready = k("get", "deployment", helm_release.RELEASE, "-n", helm_release.NAMESPACE, "-o",
                  "jsonpath={.status.readyReplicas}").stdout
        assert ready == "3"
        k("create", "namespace", "team-run")
        pod = json.loads(k("create", "-n", "team-run", "-f", "-", "-o", "json", input=json.dumps(SLICE_POD)).stdout)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
        # The webhook is the replicas: its Service's endpoints are their pods on the node.
        slices = json.loads(k("get", "endpointslices", "-n", helm_release.NAMESPACE, "-l",
                              f"kubernetes.io/service-name={helm_release.RELEASE}", "-o", "json").stdout)
        assert len({a for s in slices["items"] for e in s.get("endpoints") or [] for a in e["addresses"]}) == 3

        assert run.stop(signal.SIGINT, timeout=180) == 0
        said = run.until(" is removed")
        assert "stopping ..." in said and "stopped: the pods, kubelet, containerd and the control plane" in said
        cgroup_root = f"{own_memory_cgroup().rstrip('/')}/{workdir.name}"  # the run is in our memory cgroup
        assert hierarchies(), "no cgroup hierarchy to check"

        def left() -> tuple[dict[str, list[str]], list[int]]:
            return ({what: v for what, v in leftovers(workdir, cgroup_root, inode).items() if v},
                    processes_mentioning(run.dir))

        until_seen("nothing of the run left", left, lambda seen: not any(seen), 10, 0.2)
        assert list(run.dir.iterdir()) == []
    finally:
        run.kill()
        shutil.rmtree(base, ignore_errors=True)
