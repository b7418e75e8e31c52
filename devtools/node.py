"""A real node beside the local control plane: containerd, kubelet and CNI running the chart's pods.

The e2e tier has no kubelet, so the chart's Deployment, probes, Service and rollouts are only rendered
there. This tier runs them: kubelet (built with the control plane, `scripts/build-controlplane.sh`),
Debian's containerd, runc and CNI plugins (`make node-tools`), and the image `make image` builds,
imported into containerd.

Everything runs in a network and mount namespace of its own (`devtools.netns`): etcd, kube-apiserver,
the controllers, containerd, kubelet, the pods. Its only addresses are loopback, the bridge `hmw0` with
the node's IP (10.244.0.1/24, pods get .10 and up from CNI's host-local) and the `kubernetes` Service's
cluster IP (10.0.0.1) on its loopback: with no kube-proxy, that is how pods reach the API server at the
address kubelet gives them (KUBERNETES_SERVICE_HOST), as kube-proxy's IPVS mode binds cluster IPs to a
local interface; a route in every pod sends 10.0.0.0/24 to the node, and the API server listens on port
443 of every address of the namespace. kube-apiserver itself calls webhook Services through their
endpoints (`--enable-aggregator-routing`). The test process stays outside and reaches the API server
through a forwarded loopback port (`Namespace.forward`): one URL for kubectl, helm and the tests, no
second pytest inside the namespace, and a teardown that can be checked from outside.

Settings the machine needs (cgroup v1, no CAP_SYS_RESOURCE, no registry): kubelet on cgroupfs with its
cgroup root under this process's memory cgroup (made in every v1 hierarchy), no node-allocatable
enforcement, no swap or cgroup-v1 refusal, no iptables chains; containerd clamps OOM scores instead of
lowering them, has no AppArmor, and its pod sandbox is a pause image built here (`controlplane/pause`).

`stop()` leaves nothing: pods deleted, kubelet, the containers left in our cgroups, containerd's shims
(processes in our network namespace), containerd and the control plane stopped by PID, the namespace's
holder last (its mounts and bridge go with it), the cgroups removed. `leftovers()` says what is left.

    python -m devtools.node up     start one, print the kubeconfig, stop everything on Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from devtools import image, pki
from devtools.binaries import REPO_ROOT, ControlPlaneError, binaries
from devtools.controlplane import ControlPlane
from devtools.netns import Namespace
from devtools.procs import spawn, tail, terminate
from hami_mt_webhook.service import certs

NODE_NAME = "hmw-node"
NODE_IP = "10.244.0.1"
POD_SUBNET = "10.244.0.0/24"
BRIDGE = "hmw0"
#: Where the tier's processes and the test process meet: the API server's port inside the namespace.
APISERVER_PORT = 443
PAUSE_SOURCE = REPO_ROOT / "controlplane" / "pause"
CACHE = image.CACHE.parent / "node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
RUNC = "/usr/sbin/runc"
CNI_BIN = "/usr/lib/cni"


class NodeError(ControlPlaneError):
    """The node could not be started; the message carries the relevant log tail."""


def pause_image() -> str:
    """The pause image, built once per state of its source: a static Go program FROM scratch."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(PAUSE_SOURCE.iterdir()))).hexdigest()[:12]
    name = f"localhost/hami-mt-pause:{digest}"
    if image.exists(name):
        return name
    with tempfile.TemporaryDirectory(prefix="hami-mt-pause-") as tmp:
        env = {**os.environ, "CGO_ENABLED": "0"}
        subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", f"{tmp}/pause", "."],
                       cwd=PAUSE_SOURCE, env=env, check=True, capture_output=True, timeout=600)
        Path(tmp, "Containerfile").write_text('FROM scratch\nCOPY pause /pause\nUSER 65535:65535\n'
                                              'ENTRYPOINT ["/pause"]\n')
        image.run("build", "--quiet", "--runtime", "runc", "--tag", name, tmp)
    return name


def image_archive(name: str) -> Path:
    """A docker-archive of a podman image, kept in the cache per image ID (saving 400 MB takes seconds)."""
    image_id = image.run("image", "inspect", "--format", "{{.Id}}", name).stdout.strip()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"{name.rsplit('/', 1)[-1].replace(':', '_')}-{image_id}.tar"
    if not archive.exists():
        for old in CACHE.glob(f"{name.rsplit('/', 1)[-1].split(':')[0]}_*.tar"):
            old.unlink()
        image.run("save", "--format", "docker-archive", "-o", f"{archive}.tmp", name)
        os.replace(f"{archive}.tmp", archive)
    return archive


# --- cgroups ----------------------------------------------------------------------------------------------


def hierarchies(unified: bool = False) -> list[Path]:
    """The mounted cgroup v1 hierarchies; with `unified`, the v2 one of a hybrid layout too, where runc
    mirrors the containers' cgroups (kubelet does not use it, but what is made there must go too)."""
    found = []
    kinds = ("cgroup", "cgroup2") if unified else ("cgroup",)
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] in kinds and Path(fields[1]).is_relative_to(CGROUP_ROOT):
            found.append(Path(fields[1]))
    return sorted(set(found))


def own_memory_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise NodeError("this process has no memory cgroup (cgroup v1 expected)")


def make_cgroups(root: str) -> list[Path]:
    """`root` in every hierarchy, cpuset's cpus and mems copied down; returns the dirs made, topmost
    first (what `remove_cgroups` removes)."""
    made = []
    for h in hierarchies():
        path = h
        for part in Path(root).relative_to("/").parts:
            parent, path = path, path / part
            if not path.is_dir():
                path.mkdir()
                made.append(path)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (path / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((parent / name).read_text())
    return made


def cgroup_pids(dirs: Sequence[Path]) -> set[int]:
    """The processes in these cgroups and below."""
    pids: set[int] = set()
    for top in dirs:
        for procs in top.rglob("cgroup.procs") if top.is_dir() else ():
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
    return pids


def remove_cgroups(made: Sequence[Path], timeout: float = 10.0) -> list[Path]:
    """rmdir the made dirs and whatever kubelet made below them, deepest first; returns what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for top in reversed(made):
            if not top.is_dir():
                continue
            for d, _, _ in sorted(os.walk(top, topdown=False), key=lambda w: -len(Path(w[0]).parts)):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            if top.is_dir():
                left.append(top)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# --- processes --------------------------------------------------------------------------------------------


def pids_in_netns(inode: int) -> set[int]:
    """Every process whose network namespace is the one with this inode."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino == inode:
                    found.add(int(entry.name))
    return found


def kill_pids(pids: set[int], grace: float = 5.0) -> None:
    """SIGTERM these processes, SIGKILL those still there after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while (pids := {p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)}) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


# --- the node ---------------------------------------------------------------------------------------------


class Node:
    """The control plane, containerd and kubelet in a namespace of their own; single use, like ControlPlane.

    `images` are podman images imported into containerd (the chart's by default; none: the pause image
    only, which always is). `version` picks the Kubernetes binaries as `devtools.binaries` does.
    """

    def __init__(self, *, workdir: Path | None = None, version: str | None = None,
                 images: Sequence[str] | None = None, ready_timeout: float = 120.0) -> None:
        self._parent_dir = workdir
        self.version = version
        self.images = [image.reference()] if images is None else list(images)
        self.ready_timeout = ready_timeout
        self.workdir = Path()
        self.ns: Namespace | None = None
        self.cp: ControlPlane | None = None
        self.containerd: subprocess.Popen[bytes] | None = None
        self.kubelet: subprocess.Popen[bytes] | None = None
        self.cgroup_root = ""
        #: The pause image, containerd's sandbox image (and a small image for a test pod).
        self.pause = ""
        self._cgroups_made: list[Path] = []
        self._netns_inode = 0
        self._stopped = False
        #: Seconds from `start()` to the node Ready, and from kubelet's start to it.
        self.startup_seconds: float | None = None
        self.kubelet_ready_seconds: float | None = None

    # paths -------------------------------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def kubeconfig(self) -> Path:
        return self.controlplane.kubeconfig

    @property
    def controlplane(self) -> ControlPlane:
        if self.cp is None:
            raise NodeError("the node has not been started")
        return self.cp

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.controlplane.kubectl(*args, **kwargs)

    def inside(self, *cmd: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A command run in the node's namespaces (ctr, ip, ...)."""
        if self.ns is None:
            raise NodeError("the node has not been started")
        return self.ns.run(*cmd, check=check, timeout=timeout)

    def ctr(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return self.inside(CTR, f"--address={self.socket}", "--namespace=k8s.io", *args, timeout=timeout)

    # lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Node:
        if self.ns is not None:
            raise NodeError("a Node starts once; make a new one")
        bin_dir = binaries(self.version)
        if not os.access(bin_dir / "kubelet", os.X_OK):
            raise NodeError(f"{bin_dir} has no kubelet: run scripts/build-controlplane.sh")
        for tool in (CONTAINERD, CTR, RUNC, f"{CNI_BIN}/bridge"):
            if not os.access(tool, os.X_OK):
                raise NodeError(f"{tool} is missing: `make node-tools` installs containerd, runc and "
                                "containernetworking-plugins")
        pause = self.pause = pause_image()
        archives = [image_archive(name) for name in [pause, *self.images]]
        started = time.monotonic()
        if self._parent_dir is not None:
            self._parent_dir.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="hami-mt-node-", dir=self._parent_dir))
        try:
            self.cgroup_root = f"{own_memory_cgroup().rstrip('/')}/{self.workdir.name}"
            self.ns = Namespace(self.workdir, setup=[
                f"ip addr add {pki.SERVICE_IP}/32 dev lo",
                f"ip link add {BRIDGE} type bridge", f"ip addr add {NODE_IP}/24 dev {BRIDGE}",
                f"ip link set {BRIDGE} up"], on_exit=reaper(self.workdir, self.cgroup_root)).start()
            self._netns_inode = self.ns.inode()
            self.cp = ControlPlane(bin_dir=bin_dir, workdir=self.workdir, controllers=True,
                                   command_prefix=self.ns.prefix, reach=self.ns.forward,
                                   apiserver_port=APISERVER_PORT, node_ip=NODE_IP,
                                   ready_timeout=self.ready_timeout)
            self.cp.start()
            self._cgroups_made = make_cgroups(self.cgroup_root)
            self._start_containerd(pause)
            for archive in archives:
                self.ctr("images", "import", str(archive))
            kubelet_started = time.monotonic()
            self._start_kubelet(bin_dir)
            self.wait_ready()
            self.kubelet_ready_seconds = time.monotonic() - kubelet_started
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _start_containerd(self, pause: str) -> None:
        (self.workdir / "cni" / "net.d").mkdir(parents=True)
        (self.workdir / "cni" / "net.d" / "10-hmw.conflist").write_text(json.dumps(cni_config(self.workdir)))
        config = containerd_config(self.workdir, pause)
        (self.workdir / "containerd.toml").write_text(config)
        assert self.ns is not None
        self.containerd = spawn([*self.ns.prefix, CONTAINERD, f"--config={self.workdir / 'containerd.toml'}"],
                                self.workdir / "containerd.log")
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.containerd.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"containerd did not start; end of its log:\n{tail(self.workdir / 'containerd.log')}")
            time.sleep(0.1)

    def _start_kubelet(self, bin_dir: Path) -> None:
        cp = self.controlplane
        assert cp._ca is not None and self.ns is not None
        kubelet_dir = self.workdir / "kubelet-pki"
        kubelet_dir.mkdir()
        kubeconfig = pki.write_node_pki(kubelet_dir, cp._ca, cp.inner_server, NODE_NAME, NODE_IP)
        (self.workdir / "resolv.conf").write_text("")  # pods get no name server: nothing to send queries to
        config = kubelet_config(self.workdir, cp.ca_file, kubelet_dir, self.socket, self.cgroup_root, cp.minor)
        certs.write_atomic(self.workdir / "kubelet.yaml", yaml.safe_dump(config, sort_keys=False).encode())
        self.kubelet = spawn([*self.ns.prefix, str(bin_dir / "kubelet"), f"--config={self.workdir / 'kubelet.yaml'}",
                              f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
                              f"--node-ip={NODE_IP}", f"--root-dir={self.workdir / 'kubelet'}", "--v=1"],
                             self.workdir / "kubelet.log")

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the node reports Ready (kubelet, containerd and CNI all answer) and namespace `default` has
        its ServiceAccount (a pod created before the controller makes it is refused)."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while self.ready_status() != "True" or self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                                           check=False).returncode != 0:
            if self.kubelet is not None and self.kubelet.poll() is not None:
                raise NodeError(f"kubelet exited with {self.kubelet.returncode}; end of its log:\n"
                                f"{tail(self.workdir / 'kubelet.log')}")
            if time.monotonic() > deadline:
                raise NodeError(f"node {NODE_NAME} not Ready after {timeout or self.ready_timeout:.0f}s; end of "
                                f"kubelet's log:\n{tail(self.workdir / 'kubelet.log')}")
            time.sleep(0.5)

    def ready_status(self) -> str:
        done = self.kubectl("get", "node", NODE_NAME, "-o",
                            'jsonpath={.status.conditions[?(@.type=="Ready")].status}', check=False)
        return done.stdout.strip()

    def pod_memory(self, namespace: str) -> dict[str, int]:
        """Each running pod's working set in bytes (usage less inactive file pages, as kubelet counts it),
        read from its memory cgroup: kubelet's own summary has no figures for pods under a nested cgroup
        root on cgroup v1."""
        pods = json.loads(self.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        memory = next(h for h in hierarchies() if (h / "memory.usage_in_bytes").exists())
        root = memory / self.cgroup_root.lstrip("/")
        out = {}
        for pod in pods:
            if pod["spec"].get("nodeName") != NODE_NAME or pod["status"].get("phase") != "Running":
                continue
            found = next(root.rglob(f"pod{pod['metadata']['uid']}"), None)
            if found is None:
                continue
            usage = int((found / "memory.usage_in_bytes").read_text())
            stat = dict(line.split() for line in (found / "memory.stat").read_text().splitlines())
            out[pod["metadata"]["name"]] = max(0, usage - int(stat.get("total_inactive_file", 0)))
        return out

    # stopping ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything, by PID, and remove the cgroups, the namespace and the work dir. Safe twice."""
        if self._stopped:
            return
        self._stopped = True
        if self.cp is not None and self.kubelet is not None and self.kubelet.poll() is None:
            # kubelet stops the pods' containers and unmounts their volumes itself.
            self.kubectl("delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={NODE_NAME}",
                         "--grace-period=1", "--wait=true", "--timeout=30s", check=False, timeout=45)
        if self.kubelet is not None:
            terminate(self.kubelet)
        kill_pids(cgroup_pids(self._cgroups_made))  # containers kubelet did not stop
        if self.containerd is not None:
            terminate(self.containerd)
        if self._netns_inode:  # containerd's shims, which outlive it
            known = {os.getpid(), *(self.cp.pids.values() if self.cp else ()), *([self.ns.pid] if self.ns else [])}
            kill_pids(pids_in_netns(self._netns_inode) - known)
        if self.cp is not None:
            self.cp.stop()
        if self.ns is not None:
            self.ns.stop()
        remove_cgroups([*self._cgroup_dirs(), *self._cgroups_made])
        if self.workdir != Path():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _cgroup_dirs(self) -> list[Path]:
        """The node's cgroup root in every hierarchy, the unified one included."""
        if not self.cgroup_root:
            return []
        return [h / self.cgroup_root.lstrip("/") for h in hierarchies(unified=True)]

    def leftovers(self) -> dict[str, list[str]]:
        """What of this node is still on the machine (nothing, after `stop()`)."""
        return leftovers(self.workdir, self.cgroup_root, self._netns_inode)


def leftovers(workdir: Path, cgroup_root: str, netns_inode: int) -> dict[str, list[str]]:
    """What of a node is still on the machine: mounts under its work dir, its cgroups, processes in its
    network namespace, the work dir. A function, so that a node another process ran can be checked too."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if workdir != Path() and line.split()[1].startswith(str(workdir))]
    cgroups = [str(d) for d in (h / cgroup_root.lstrip("/") for h in hierarchies(unified=True))
               if cgroup_root and d.exists()]
    procs = [str(p) for p in pids_in_netns(netns_inode)] if netns_inode else []
    files = [str(workdir)] if workdir != Path() and workdir.exists() else []
    return {"mounts": mounts, "cgroups": cgroups, "processes": procs, "files": files}


def reaper(workdir: Path, cgroup_root: str) -> list[str]:
    """Shell for the namespace's holder to run when it stops: after `Node.stop()` it finds nothing, but when
    the test process was killed (and with it kubelet, containerd and the control plane), it stops the
    containers and shims left, removes the cgroups and the work dir."""
    dirs = " ".join(str(h / cgroup_root.lstrip("/")) for h in hierarchies(unified=True))
    return [
        f"for f in $(find {dirs} -name cgroup.procs 2>/dev/null); do kill -9 $(cat $f) 2>/dev/null; done",
        "net=$(readlink /proc/$$/ns/net)",
        'for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" != $$ ] && '
        '[ "$(readlink $p/ns/net 2>/dev/null)" = "$net" ] && kill -9 $pid 2>/dev/null; done',
        f"for i in 1 2 3 4 5 6 7 8 9 10; do find {dirs} -depth -type d -exec rmdir {{}} + 2>/dev/null; "
        f"[ -z \"$(ls -d {dirs} 2>/dev/null)\" ] && break; sleep 0.3; done",
        # Our parent gone (the holder was given to another), not merely stopping us: the work dir goes too.
        f"if [ \"$(cut -d' ' -f4 /proc/$$/stat)\" != {os.getpid()} ]; then",
        f"  grep -o ' {workdir}[^ ]*' /proc/self/mounts | sort -r | xargs -r umount -l",
        f"  rm -rf {workdir}",
        "fi",
    ]


# --- configurations ---------------------------------------------------------------------------------------


def cni_config(workdir: Path) -> dict[str, Any]:
    """A bridge without gateway or masquerade (no iptables, no forwarding); pods route the cluster IPs to
    the node, where the `kubernetes` Service's one is local."""
    return {"cniVersion": "0.4.0", "name": "hmw", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local",
                  "ranges": [[{"subnet": POD_SUBNET, "rangeStart": "10.244.0.10", "rangeEnd": "10.244.0.250",
                               "gateway": NODE_IP}]],
                  "routes": [{"dst": pki.SERVICE_CIDR, "gw": NODE_IP}],
                  "dataDir": str(workdir / "cni" / "ipam")}},
        {"type": "loopback"}]}


def containerd_config(workdir: Path, pause: str) -> str:
    d = workdir / "containerd"
    return f"""\
version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
oom_score = 0
[grpc]
  address = "{d / 'containerd.sock'}"
[ttrpc]
  address = "{d / 'containerd-ttrpc.sock'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{workdir / 'cni' / 'net.d'}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
"""


def kubelet_config(workdir: Path, ca_file: Path, pki_dir: Path, socket: Path, cgroup_root: str,
                   minor: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"), "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,  # pods under <cgroupRoot>/kubepods; without it they land at each hierarchy's root
        "cgroupRoot": cgroup_root,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "maxOpenFiles": _hard_nofile(),
        "kernelMemcgNotification": False,
        "resolvConf": str(workdir / "resolv.conf"),
        "registerNode": True,
        "rotateCertificates": False,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "podPidsLimit": -1,
    }
    if minor >= 35:
        config["failCgroupV1"] = False  # cgroup v1 is refused from 1.35 unless asked for
    return config


def _hard_nofile() -> int:
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard if hard != resource.RLIM_INFINITY else 1048576


# --- `python -m devtools.node up` -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.node", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start a node and the control plane, print the kubeconfig, stop on Ctrl-C")
    parser.parse_args(argv)
    stopping = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: stopping.set())
    node = Node()
    try:
        node.start()
        print(f"node {NODE_NAME} Ready in {node.startup_seconds:.1f}s", file=sys.stderr)
        print(f"export KUBECONFIG={node.kubeconfig}", flush=True)
        stopping.wait()
        return 0
    except ControlPlaneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        node.stop()


if __name__ == "__main__":
    sys.exit(main())
