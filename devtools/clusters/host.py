"""One real node of the node tier: its own network and mount namespace, containerd, kubelet and cgroups.

The e2e tier has no kubelet, so the chart's Deployment, probes, Service and rollouts are only rendered
there. The node tier runs them (`devtools.clusters.nodes.NodeCluster`, one or more of these `Host`s beside a control
plane): kubelet (built with the control plane, `scripts/build-controlplane.sh`), Debian's containerd,
runc and CNI plugins (`make node-tools`), and the image `make image` builds, imported into containerd.

A host is a network and mount namespace of its own (`devtools.clusters.netns`), so that it can be cut off or
killed as a whole, as a machine: its bridge `hmw0` with the node's IP (10.244.N.1/24; pods get .10 and
up from CNI's host-local), containerd with its own root, state and sockets in the host's work dir,
kubelet with its own root dir and its own cgroup root, and one link to the fabric (`hmwf0`, the other
end of a veth pair the cluster makes; `devtools.clusters.nodes` describes the routes). Its addresses exist only
inside its namespace.

Settings the machine needs (cgroup v1, no CAP_SYS_RESOURCE, no registry): kubelet on cgroupfs with its
cgroup root under this process's memory cgroup (made in every v1 hierarchy), no node-allocatable
enforcement, no swap or cgroup-v1 refusal, no iptables chains; containerd clamps OOM scores instead of
lowering them, has no AppArmor, and its pod sandbox is a pause image built here (`controlplane/commands/pause`).

What belongs to a host, and so what its faults and its stop end, by PID: the processes in its network
namespace (kubelet, containerd, containerd's shims, which outlive containerd) but the namespace's
holder, and the processes in its cgroups (the pods' containers, which are in network namespaces of
their own). `leftovers()` says what of a node is still on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from devtools import paths, pki
from devtools.builds import image
from devtools.builds.binaries import ControlPlaneError
from devtools.clusters.netns import Namespace
from devtools.paths import REPO_ROOT
from devtools.procs import spawn, tail, terminate
from devtools.waiting import NotWithin, until
from hami_mt_webhook.service import certs

BRIDGE = "hmw0"
#: The host's end of its link to the fabric (`devtools.clusters.nodes`).
UPLINK = "hmwf0"
#: All pod ranges and node IPs: node N is 10.244.N.1 with pods in 10.244.N.0/24; 10.244.0.1 is the fabric's.
POD_NETWORK = "10.244.0.0/16"
#: The control plane's address in the fabric: the API server's advertised address, the hosts' next hop.
FABRIC_IP = "10.244.0.1"
#: Where the tier's processes and the test process meet: the API server's port inside the fabric.
APISERVER_PORT = 443
PAUSE_SOURCE = REPO_ROOT / "controlplane" / "commands" / "pause"
CACHE = paths.CACHE / "node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
RUNC = "/usr/sbin/runc"
CNI_BIN = "/usr/lib/cni"
ZONE_LABEL = "topology.kubernetes.io/zone"


def node_name(index: int) -> str:
    return f"hmw-node-{index}"


def node_ip(index: int) -> str:
    return f"10.244.{index}.1"


def pod_subnet(index: int) -> str:
    return f"10.244.{index}.0/24"


def zone(index: int) -> str:
    """zone-a for node 1, zone-b for node 2, ...: a different zone per node, as `topology.kubernetes.io/zone`."""
    return f"zone-{chr(ord('a') + index - 1)}"


def mac(index: int, end: int) -> str:
    """A fixed, locally administered MAC for an end of host `index`'s uplink (1: the fabric's, 2: the host's):
    known beforehand, so each side's neighbour entry for the other can be permanent (see `Host.kill`)."""
    return f"02:68:6d:{index >> 8:02x}:{index & 0xff:02x}:{end:02x}"


class NodeError(ControlPlaneError):
    """The node could not be started; the message carries the relevant log tail."""


def pause_image() -> str:
    """The pause image, built once per state of its source: a static Go program FROM scratch."""
    return image.go_command(PAUSE_SOURCE, "hami-mt-pause")


#: How long an image archive nothing imported is kept.
ARCHIVE_KEPT_SECONDS = 30 * 86400


def image_archive(name: str) -> Path:
    """A docker-archive of a podman image, kept in the cache per name, tag and image ID (saving 400 MB takes
    seconds), so two tags of one repository (this tree's image and the previous release's) are kept side by
    side."""
    image_id = image.run("image", "inspect", "--format", "{{.Id}}", name).stdout.strip()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    stem = name.rsplit('/', 1)[-1].replace(':', '_')  # one archive per name and tag: a rebuild replaces it
    archive = CACHE / f"{stem}-{image_id}.tar"
    for stale in CACHE.glob("*.tar"):  # a tag no longer used (an older version's) goes after a month
        if stale != archive and stale.stat().st_mtime < time.time() - ARCHIVE_KEPT_SECONDS:
            stale.unlink()
    if archive.exists():
        archive.touch()
    else:
        for old in CACHE.glob(f"{stem}-*.tar"):
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
    first (`remove_cgroups` removes them). Where this process is not in `root`'s parent (a hierarchy whose
    cgroup is another, the cpu one here), the parents are made too: they may be shared with another
    tier's cluster, which lives in the same memory cgroup."""
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


def remove_cgroups(roots: Sequence[Path], made: Sequence[Path] = (), timeout: float = 10.0) -> list[Path]:
    """rmdir `roots` and whatever kubelet made below them, deepest first, again until they are gone (a cgroup
    is busy until its last process has exited); then those of `made` (what `make_cgroups` made) above a root
    once they are empty, never what is below them: another tier's cluster may have its cgroups there (two
    node tiers share the parents; walking one removed a killed node's empty cgroups under the other, and its
    kubelet could not start again). Returns what is left."""
    mine = [Path(r) for r in roots]
    shared = sorted((m for m in made if any(m in r.parents for r in mine)), key=lambda m: -len(m.parts))
    left: list[Path] = []

    def removed() -> bool:
        left.clear()
        for top in mine:
            if not top.is_dir():
                continue
            for d, _, _ in sorted(os.walk(top, topdown=False), key=lambda w: -len(Path(w[0]).parts)):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            if top.is_dir():
                left.append(top)
        return not left

    with contextlib.suppress(NotWithin):
        until("the cgroups removed", removed, timeout, 0.2)
    for parent in shared:  # deepest first; one that holds another's cgroups stays
        with contextlib.suppress(OSError):
            os.rmdir(parent)
    return left


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
    left = set(pids)

    def gone() -> bool:
        left.difference_update([p for p in left if not Path(f"/proc/{p}").exists() or _zombie(p)])
        return not left

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(NotWithin):  # what outlives SIGKILL is the caller's to find (`leftovers`)
            until(f"processes {sorted(left)} gone after {sig.name}", gone, wait, 0.1)
        if not left:
            return


def process_state(pid: int) -> str:
    """The process's state letter from /proc/PID/stat (R, S, D, T, Z, ...); Z for one that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return stat[stat.rindex(")") + 2]


def _zombie(pid: int) -> bool:
    return process_state(pid) == "Z"


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it (a namespace's holder and its `sleep`)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, []))
    return found


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)}


# --- one node ---------------------------------------------------------------------------------------------


class Host:
    """One node: a network and mount namespace with its bridge and uplink, containerd and kubelet on state
    of their own under `workdir`, pods under the cgroup root `cgroup_root`. Made and wired by
    `devtools.clusters.nodes.NodeCluster`, which owns the control plane; the faults that concern the node as a machine
    (`kill`, `revive`, `restart_kubelet`, `restart_containerd`) are here.

    `labels` are added to the node's (`topology.kubernetes.io/zone`, zone-a for node 1, ...); kubelet sets
    them when it registers, so only labels NodeRestriction lets a kubelet set (not `*.kubernetes.io/`
    ones outside its allowed prefixes).
    """

    def __init__(self, index: int, workdir: Path, cgroup_root: str, labels: Mapping[str, str] | None = None) -> None:
        self.index = index
        self.name = node_name(index)
        self.ip = node_ip(index)
        self.subnet = pod_subnet(index)
        self.labels = {ZONE_LABEL: zone(index), **(labels or {})}
        self.workdir = workdir
        self.cgroup_root = cgroup_root
        self.ns: Namespace | None = None
        self.netns_inode = 0
        self.containerd: subprocess.Popen[bytes] | None = None
        self.kubelet: subprocess.Popen[bytes] | None = None
        #: True from `kill()` to `revive()`.
        self.killed = False
        self._kubelet_cmd: list[str] = []
        self._cgroups_made: list[Path] = []

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def fabric_link(self) -> str:
        """The fabric's end of this host's uplink."""
        return f"hmwn{self.index}"

    def inside(self, *cmd: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A command run in the host's namespaces (ctr, ip, ...)."""
        if self.ns is None:
            raise NodeError(f"{self.name} has not been started")
        return self.ns.run(*cmd, check=check, timeout=timeout)

    def ctr(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return self.inside(CTR, f"--address={self.socket}", "--namespace=k8s.io", *args, timeout=timeout)

    # making ------------------------------------------------------------------------------------------------

    def make_namespace(self) -> Namespace:
        """The host's namespace with its bridge, forwarding on (it routes between its pods and the fabric)."""
        self.workdir.mkdir(parents=True)
        self.ns = Namespace(self.workdir, setup=[
            f"ip link add {BRIDGE} type bridge", f"ip addr add {self.ip}/24 dev {BRIDGE}", f"ip link set {BRIDGE} up",
            "echo 1 > /proc/sys/net/ipv4/ip_forward"], on_exit=reaper(self.workdir, self.cgroup_root)).start()
        self.netns_inode = self.ns.inode()
        return self.ns

    def fabric_commands(self) -> list[str]:
        """Shell for the fabric's namespace: the veth pair to this host (its other end moved into the host's
        namespace), the route to the host's pods and node IP, and a permanent neighbour entry for the host."""
        assert self.ns is not None
        link = self.fabric_link
        return [f"ip link add {link} address {mac(self.index, 1)} type veth peer name {UPLINK} "
                f"address {mac(self.index, 2)} netns {self.ns.pid}",
                f"ip link set {link} up",
                f"ip neigh replace {self.ip} lladdr {mac(self.index, 2)} dev {link} nud permanent",
                f"ip route replace {self.subnet} via {self.ip} dev {link} onlink src {FABRIC_IP}"]

    def uplink_up(self) -> None:
        """The host's end of its link up, with what taking it down removed: the neighbour entry for the
        fabric and the routes to the cluster IPs and to the other nodes' pods, both through the fabric."""
        self.inside("sh", "-ec", "\n".join([
            f"ip link set {UPLINK} up",
            f"ip neigh replace {FABRIC_IP} lladdr {mac(self.index, 1)} dev {UPLINK} nud permanent",
            f"ip route replace {pki.SERVICE_CIDR} via {FABRIC_IP} dev {UPLINK} onlink src {self.ip}",
            f"ip route replace {POD_NETWORK} via {FABRIC_IP} dev {UPLINK} onlink src {self.ip}"]))

    def make_cgroups(self) -> None:
        self._cgroups_made = make_cgroups(self.cgroup_root)

    def start_containerd(self, pause: str | None = None) -> None:
        """containerd on the host's own root, state and sockets; with `pause`, its configuration and CNI's are
        written first (a restart keeps them)."""
        if self.ns is None:
            raise NodeError(f"{self.name} has no namespace")
        if pause is not None:
            (self.workdir / "cni" / "net.d").mkdir(parents=True)
            (self.workdir / "cni" / "net.d" / "10-hmw.conflist").write_text(
                json.dumps(cni_config(self.workdir, self.index)))
            (self.workdir / "containerd.toml").write_text(containerd_config(self.workdir, pause))
        for stale in (self.socket, self.socket.with_name("containerd-ttrpc.sock")):  # left by a killed one
            stale.unlink(missing_ok=True)
        containerd = self.containerd = spawn([*self.ns.prefix, CONTAINERD,
                                              f"--config={self.workdir / 'containerd.toml'}"],
                                             self.workdir / "containerd.log")

        def not_started(message: str = "it exited") -> NodeError:
            return NodeError(f"containerd of {self.name} did not start ({message}); end of its log:\n"
                             f"{tail(self.workdir / 'containerd.log')}")

        def listening() -> bool:
            if containerd.poll() is not None:
                raise not_started()
            return self.socket.exists()

        until("containerd's socket", listening, 30, 0.1, fail=not_started)

    def start_kubelet(self, bin_dir: Path | None = None, ca: certs.KeyPair | None = None,
                      ca_file: Path | None = None, minor: int = 0) -> None:
        """kubelet, logging in at the `kubernetes` Service's cluster IP (routed to the fabric); the first start
        writes its certificates and configuration (`bin_dir`, `ca`, `ca_file`, `minor` needed), a restart
        reuses them, and its root dir, as a rebooted machine does."""
        if self.ns is None:
            raise NodeError(f"{self.name} has no namespace")
        if not self._kubelet_cmd:
            assert bin_dir is not None and ca is not None and ca_file is not None
            pki_dir = self.workdir / "kubelet-pki"
            pki_dir.mkdir()
            server = f"https://{pki.SERVICE_IP}:{APISERVER_PORT}"
            kubeconfig = pki.write_node_pki(pki_dir, ca, server, self.name, self.ip)
            (self.workdir / "resolv.conf").write_text("")  # pods get no name server: nothing to send queries to
            config = kubelet_config(self.workdir, ca_file, pki_dir, self.socket, self.cgroup_root, minor, self.ip)
            certs.write_atomic(self.workdir / "kubelet.yaml", yaml.safe_dump(config, sort_keys=False).encode())
            labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
            self._kubelet_cmd = [str(bin_dir / "kubelet"), f"--config={self.workdir / 'kubelet.yaml'}",
                                 f"--kubeconfig={kubeconfig}", f"--hostname-override={self.name}",
                                 f"--node-ip={self.ip}", f"--node-labels={labels}",
                                 f"--root-dir={self.workdir / 'kubelet'}", "--v=1"]
        self.kubelet = spawn([*self.ns.prefix, *self._kubelet_cmd], self.workdir / "kubelet.log")

    # what belongs to it ----------------------------------------------------------------------------------

    def cgroup_dirs(self) -> list[Path]:
        """The host's cgroup root in every hierarchy, the unified one included."""
        return [h / self.cgroup_root.lstrip("/") for h in hierarchies(unified=True)]

    def processes(self) -> set[int]:
        """This host's processes: those in its network namespace but the namespace's holder (and its
        `sleep`), and those in its cgroups (the pods' containers)."""
        mine = pids_in_netns(self.netns_inode) if self.netns_inode else set()
        if self.ns is not None and self.ns.holder is not None:
            mine -= descendants(self.ns.pid)
        return alive((mine | cgroup_pids(self.cgroup_dirs())) - {os.getpid()})

    def container_cgroup(self, pod_uid: str, container_id: str) -> Path:
        """The container's memory cgroup (kubelet on cgroupfs: <root>/kubepods[/<qos>]/pod<uid>/<id>)."""
        memory = next(h for h in hierarchies() if (h / "memory.usage_in_bytes").exists())
        for found in (memory / self.cgroup_root.lstrip("/")).rglob(f"pod{pod_uid}"):
            if (found / container_id).is_dir():
                return found / container_id
        raise NodeError(f"no cgroup of container {container_id[:12]} of pod {pod_uid} on {self.name}")

    # faults ----------------------------------------------------------------------------------------------

    def kill(self) -> None:
        """The node dies as a machine that lost power: first its network goes silent, then every process of
        it is SIGKILLed at once; nothing says goodbye to the API server (the Node and its pods stay as they
        were, its Lease is no longer renewed).

        Silent: the host's end of its uplink is set down. The kernel then drops the host's routes through
        it (they come back with `revive`), so nothing leaves the host; the fabric's end loses its carrier
        and its route to the host stays (marked linkdown, still used: `ignore_routes_with_linkdown` is 0),
        and the link's queue discipline becomes noop while the carrier is off, so what the fabric sends
        there (kube-apiserver's calls to kubelet and to the node's pods) is dropped without an answer: no
        RST, no ICMP. The fabric's neighbour entry for the host is permanent, so no ARP can fail and turn
        the silence into EHOSTUNREACH. A connect to the node times out, as to a powered-off machine.

        At once: kubelet, containerd, the shims and the pods' processes are all SIGSTOPped first, so none
        sees another die and reacts, then SIGKILLed; the namespace's holder stays (it is the machine's
        network, kept for `revive`), and so do the pods' network namespaces and cgroups, as a machine's
        disk keeps its state."""
        self.inside("ip", "link", "set", UPLINK, "down")
        self.killed = True
        pids = self.processes()
        signal_all(pids, signal.SIGSTOP)

        def killed() -> bool:
            nonlocal pids
            signal_all(pids, signal.SIGKILL)
            pids = self.processes()
            return not pids

        until(f"{self.name}'s processes gone", killed, 15, 0.05,
              fail=lambda m: NodeError(f"{m}: {sorted(pids)} survived SIGKILL"))
        for proc in (self.kubelet, self.containerd):
            if proc is not None:
                proc.wait()

    def revive(self) -> None:
        """The killed node back, as a machine powered on again: its network up, containerd and kubelet started
        on the state they left. containerd finds its containers dead, kubelet syncs its pods again (new
        sandboxes, the containers restarted) and reports the node Ready (`NodeCluster.revive_node` waits)."""
        self.uplink_up()
        self.start_containerd()
        self.start_kubelet()
        self.killed = False

    def restart_kubelet(self) -> None:
        """SIGTERM kubelet (its pods keep running), wait for it to exit, start it again on its state."""
        if self.kubelet is not None:
            terminate(self.kubelet)
        self.start_kubelet()

    def restart_containerd(self) -> None:
        """SIGTERM containerd (the shims, and so the containers, keep running), start it again on its state."""
        if self.containerd is not None:
            terminate(self.containerd)
        self.start_containerd()

    # stopping --------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """kubelet, the containers left in its cgroups, containerd, the shims, then the namespace (its
        mounts, bridge and uplink go with it) and the cgroups. The pods are deleted before, by the cluster."""
        if self.kubelet is not None:
            terminate(self.kubelet)
        kill_pids(cgroup_pids(self.cgroup_dirs()))  # containers kubelet did not stop
        if self.containerd is not None:
            terminate(self.containerd)
        kill_pids(self.processes())  # containerd's shims, which outlive it
        if self.ns is not None:
            self.ns.stop()
        remove_cgroups(self.cgroup_dirs(), self._cgroups_made)

    def leftovers(self) -> dict[str, list[str]]:
        return leftovers(self.workdir, self.cgroup_root, self.netns_inode)


def leftovers(workdir: Path, cgroup_root: str, *netns_inodes: int) -> dict[str, list[str]]:
    """What of a node (or a cluster of them) is still on the machine: mounts under its work dir, its cgroups,
    processes in its network namespaces, the work dir. A function, so that a node another process ran can be
    checked too."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if workdir != Path() and line.split()[1].startswith(str(workdir))]
    cgroups = [str(d) for d in (h / cgroup_root.lstrip("/") for h in hierarchies(unified=True))
               if cgroup_root and d.exists()]
    procs = [str(p) for inode in netns_inodes if inode for p in pids_in_netns(inode)]
    files = [str(workdir)] if workdir != Path() and workdir.exists() else []
    return {"mounts": mounts, "cgroups": cgroups, "processes": procs, "files": files}


def reaper(workdir: Path, cgroup_root: str, after: Path | None = None) -> list[str]:
    """Shell for a namespace's holder to run when it stops: after `stop()` it finds nothing, but when the test
    process was killed (and with it kubelet, containerd and the control plane), it stops the containers and
    shims left, removes the cgroups and the work dir. `after`: a file of other holders' PIDs to wait for
    first (the fabric's waits for its hosts', then removes the whole tier's directory and cgroups)."""
    dirs = " ".join(str(h / cgroup_root.lstrip("/")) for h in hierarchies(unified=True))
    wait = [] if after is None else [
        f"for pid in $(cat {after} 2>/dev/null); do for i in $(seq 50); do [ -d /proc/$pid ] || break; "
        "sleep 0.2; done; done"]
    return [
        f"for f in $(find {dirs} -name cgroup.procs 2>/dev/null); do kill -9 $(cat $f) 2>/dev/null; done",
        "net=$(readlink /proc/$$/ns/net)",
        'for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" != $$ ] && '
        '[ "$(readlink $p/ns/net 2>/dev/null)" = "$net" ] && kill -9 $pid 2>/dev/null; done',
        # Our parent gone (the holder was given to another), not merely stopping us: the work dir goes too.
        f"if [ \"$(cut -d' ' -f4 /proc/$$/stat)\" != {os.getpid()} ]; then gone=1; fi",
        *(f"[ -z \"$gone\" ] || {{ {line}; }}" for line in wait),
        f"for i in 1 2 3 4 5 6 7 8 9 10; do find {dirs} -depth -type d -exec rmdir {{}} + 2>/dev/null; "
        f"[ -z \"$(ls -d {dirs} 2>/dev/null)\" ] && break; sleep 0.3; done",
        "if [ -n \"$gone\" ]; then",
        f"  grep -o ' {workdir}[^ ]*' /proc/self/mounts | sort -r | xargs -r umount -l",
        f"  rm -rf {workdir}",
        "fi",
    ]


# --- configurations ---------------------------------------------------------------------------------------


def cni_config(workdir: Path, index: int) -> dict[str, Any]:
    """A bridge without gateway or masquerade (no iptables); pods route the cluster IPs and the other nodes'
    pods to their node, which forwards them to the fabric."""
    ip, subnet = node_ip(index), pod_subnet(index)
    first, last = subnet.replace(".0/24", ".10"), subnet.replace(".0/24", ".250")
    return {"cniVersion": "0.4.0", "name": "hmw", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local",
                  "ranges": [[{"subnet": subnet, "rangeStart": first, "rangeEnd": last, "gateway": ip}]],
                  "routes": [{"dst": pki.SERVICE_CIDR, "gw": ip}, {"dst": POD_NETWORK, "gw": ip}],
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
    config_path = "{d / 'certs.d'}"
"""


def kubelet_config(workdir: Path, ca_file: Path, pki_dir: Path, socket: Path, cgroup_root: str,
                   minor: int, address: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": address, "port": 10250, "readOnlyPort": 0,
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
