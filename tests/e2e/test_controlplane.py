"""The local control plane is a real one: versioned, RBAC-enforcing, storing nodes and pods, and leaving
nothing behind. The webhook's end-to-end tests rely on each of these."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.builds.binaries import BIN_ENV, VERSION_ENV, pinned_versions
from devtools.clusters.controlplane import ControlPlane, ControlPlaneError, KubectlError

from .support import none_left, processes_mentioning, until_seen

SGPU_CAPACITY = {"mthreads.com/sgpu-core": "16", "mthreads.com/sgpu-memory": "96"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_server_is_the_version_asked_for(controlplane: ControlPlane) -> None:
    """`$HAMI_MT_KUBE_VERSION` (newest, floor, 1.MINOR or an exact version) picks the binaries; the server,
    kubectl and the cache directory agree on it, and newest and floor are the pinned ends."""
    out = json.loads(controlplane.kubectl("version", "-o", "json").stdout)
    server = out["serverVersion"]["gitVersion"]
    assert out["clientVersion"]["gitVersion"] == server == controlplane.git_version
    if os.environ.get(BIN_ENV):
        return  # binaries brought by the user: whatever they are
    assert controlplane.bin_dir.name.startswith(f"{server}-etcd-")
    pins = pinned_versions()
    asked = os.environ.get(VERSION_ENV, "newest")
    expected = {"newest": pins[-1], "floor": pins[0]}.get(asked, f"v{asked.removeprefix('v')}")
    assert server == expected or server.startswith(expected + ".")


def test_node_capacity_set_through_status_subresource(controlplane: ControlPlane) -> None:
    controlplane.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "e2e-cp-node"}}))
    patch = json.dumps({"status": {"capacity": SGPU_CAPACITY}})
    controlplane.kubectl("patch", "node", "e2e-cp-node", "--subresource=status", "--type=merge", "-p", patch)
    node = json.loads(controlplane.kubectl("get", "node", "e2e-cp-node", "-o", "json").stdout)
    assert {k: node["status"]["capacity"][k] for k in SGPU_CAPACITY} == SGPU_CAPACITY


def test_rbac_is_enforced_for_user_kubeconfigs(controlplane: ControlPlane) -> None:
    user = controlplane.user_kubeconfig("e2e-someone", groups=["e2e-team"])
    whoami = json.loads(controlplane.kubectl("auth", "whoami", "-o", "json", kubeconfig=user).stdout)
    assert whoami["status"]["userInfo"]["username"] == "e2e-someone"
    assert "e2e-team" in whoami["status"]["userInfo"]["groups"]

    denied = controlplane.kubectl("get", "nodes", kubeconfig=user, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()

    controlplane.kubectl("create", "clusterrole", "e2e-node-reader", "--verb=get,list,watch", "--resource=nodes")
    controlplane.kubectl("create", "clusterrolebinding", "e2e-node-reader", "--clusterrole=e2e-node-reader",
                         "--user=e2e-someone")
    # The RBAC authorizer reads bindings from an informer cache.
    until_seen("the binding in force", lambda: controlplane.kubectl("get", "nodes", kubeconfig=user, check=False),
               lambda r: r.returncode == 0, 15, 0.2, show=lambda r: r.stderr)
    # Still nothing beyond the binding.
    assert controlplane.kubectl("get", "pods", "-A", kubeconfig=user, check=False).returncode != 0


def test_pods_on_the_default_scheduler_are_stored_never_bound(controlplane: ControlPlane) -> None:
    """The scheduler runs only the hami-scheduler profile, so other pods stay as admission left them."""
    controlplane.kubectl("create", "namespace", "e2e-cp")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "e2e-cp"},
           "spec": {"containers": [{"name": "main", "image": "registry.invalid/pause:1"}]}}
    controlplane.kubectl("create", "-f", "-", input=json.dumps(pod))
    got = json.loads(controlplane.kubectl("get", "pod", "plain", "-n", "e2e-cp", "-o", "json").stdout)
    assert got["spec"]["containers"][0]["image"] == "registry.invalid/pause:1"
    assert got["status"]["phase"] == "Pending"  # stored, never scheduled
    assert "nodeName" not in got["spec"]


def test_get_reads_what_kubectl_reads_on_one_connection_and_opens_another_when_it_is_cut(
        controlplane: ControlPlane) -> None:
    """`ControlPlane.get`, what the fault and node tiers poll with: the same objects kubectl lists, a status
    other than 200 raised with its body, and a kept-alive connection the other end closed opened again."""
    cp = controlplane
    by_kubectl = json.loads(cp.kubectl("get", "namespaces", "-l", "kubernetes.io/metadata.name=default",
                                       "-o", "json").stdout)["items"]
    by_get = cp.get("/api/v1/namespaces", labelSelector="kubernetes.io/metadata.name=default")["items"]
    assert [n["metadata"]["uid"] for n in by_get] == [n["metadata"]["uid"] for n in by_kubectl] != []
    first = cp._api.conn.sock
    assert cp.get("/api/v1/namespaces/default")["metadata"]["name"] == "default"
    assert cp._api.conn.sock is first  # kept alive
    with pytest.raises(KubectlError, match="HTTP 404"):
        cp.get("/api/v1/namespaces/no-such-namespace")
    cp._api.conn.sock.shutdown(socket.SHUT_RDWR)  # as a server's close looks to the next request
    assert cp.get("/api/v1/namespaces/default")["metadata"]["name"] == "default"
    assert cp._api.conn.sock is not first


def test_stop_leaves_no_processes_and_no_files() -> None:
    cp = ControlPlane(controllers=True).start()
    try:
        pids, workdir = cp.pids, cp.workdir
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
        assert cp.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    finally:
        cp.stop()
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert processes_mentioning(workdir) == []
    assert not workdir.exists()
    cp.stop()  # idempotent


def test_failed_start_cleans_up_and_shows_the_log(tmp_path: Path) -> None:
    cp = ControlPlane(workdir=tmp_path, apiserver_args=["--no-such-flag"])
    with pytest.raises(ControlPlaneError, match="kube-apiserver exited") as info:
        cp.start()
    assert "no-such-flag" in str(info.value)  # the tail of the apiserver log
    assert processes_mentioning(tmp_path) == []  # etcd had started; it must be gone too
    assert list(tmp_path.iterdir()) == []  # the work dir inside it is gone


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    """A test run killed by a timeout (SIGKILL: no atexit, no finalizer) must not leave a cluster behind."""
    script = (
        "import json, os, signal, sys\n"
        "from pathlib import Path\n"
        "from devtools.clusters.controlplane import ControlPlane\n"
        f"cp = ControlPlane(workdir=Path({str(tmp_path)!r})).start()\n"
        "print(json.dumps(cp.pids), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "HAMI_MT_CONTROLPLANE_BIN": str(ControlPlane().bin_dir)})
    assert proc.returncode == -9, proc.stderr
    assert set(json.loads(proc.stdout)) == {"etcd", "kube-apiserver"}
    none_left(tmp_path, "after the parent died")
