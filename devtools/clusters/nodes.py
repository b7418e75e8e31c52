"""The node tier: a control plane and N real nodes, each a machine that can be cut off or killed whole.

Every address lives only in namespaces made here, none linked to the machine's network:

- the fabric: a network and mount namespace (`devtools.clusters.netns`) holding etcd, kube-apiserver and the
  controllers. Its loopback carries the `kubernetes` Service's cluster IP (10.0.0.1; with no
  kube-proxy, this is how pods reach the API server at the address kubelet gives them, as kube-proxy's
  IPVS mode binds cluster IPs to a local interface) and the control plane's own address 10.244.0.1, the
  one kube-apiserver advertises; it listens on port 443 of every address.
- node N (`devtools.clusters.host.Host`, hmw-node-N in zone-a, zone-b, ...): a namespace of its own with its
  bridge hmw0 (10.244.N.1/24, its pods), containerd, kubelet and cgroup root, linked to the fabric by
  a veth pair (hmwnN in the fabric, hmwf0 on the node) that carries no address. The fabric routes
  10.244.N.0/24 to the node; the node routes the cluster IPs and 10.244.0.0/16 (the fabric and the
  other nodes' pods) to the fabric; pods route the same two ranges to their node; the fabric and the
  nodes forward (ip_forward, set in their own namespaces). So kube-apiserver reaches every kubelet and
  every pod (it calls webhooks by pod IP, `--enable-aggregator-routing`), and pods reach the API server
  and each other across nodes: routing only, no iptables. The MACs of each link are fixed and its
  neighbour entries permanent, so that a dead link is silent rather than unreachable.

The test process stays outside and reaches the API server through a forwarded loopback port
(`Namespace.forward`): one URL for kubectl, helm and the tests.

Faults, each callable from a test while traffic runs (from the thread that started the cluster: a
restart starts processes that die with the thread that started them, `procs.die_with_parent`):
`kill_node`/`revive_node`, `restart_kubelet`, `restart_containerd` (the node as a machine,
`Host`), and for a pod's container `freeze_pod`/`thaw_pod`, `kill_pod`, `cut_pod`/`restore_pod` and
`oom_kill_pod`; the gray ones, where the pod still answers but badly: `lose_pod` (a share of its packets
dropped), `flap_pod` (its link down and up in turn), `delay_pod` (its answers held), each undone by
`heal_pod`. Each docstring says what it does at the kernel's level. Only processes of the tier are
signalled: those in a node's network namespace or cgroups, found by PID, never by name.

`stop()` leaves nothing, even after a kill and a revive: the pods of live nodes deleted, each node's
processes stopped by PID, the control plane, the namespaces' holders last (their mounts, bridges and
links go with them), the cgroups and the work dir removed. `leftovers()` says what is left; a killed
test process leaves nothing either (each holder's `host.reaper`).

    python -m devtools.clusters.nodes up [--nodes N]    start them, print the kubeconfig, stop everything on Ctrl-C
"""

from __future__ import annotations

import argparse
import calendar
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devtools import pki
from devtools.builds import image
from devtools.builds.binaries import ControlPlaneError, binaries
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.host import (
    APISERVER_PORT,
    BRIDGE,
    CNI_BIN,
    CONTAINERD,
    CTR,
    FABRIC_IP,
    RUNC,
    Host,
    NodeError,
    cgroup_pids,
    hierarchies,
    image_archive,
    leftovers,
    make_cgroups,
    node_name,
    own_memory_cgroup,
    pause_image,
    process_state,
    reaper,
    remove_cgroups,
    signal_all,
)
from devtools.clusters.netns import Namespace
from devtools.paths import REPO_ROOT
from devtools.procs import die_with_parent, tail
from devtools.waiting import until

#: A process that fills memory once told to (a line on stdin): the pressure `oom_kill_pod` puts on a cgroup. The
#: memory is a memfd's (shmem: charged to the writer's memory cgroup, unreclaimable without swap, freed when the
#: process ends) and so not in the process's RSS, which the OOM killer's choice weighs.
HOG = ("import os, sys\nsys.stdin.readline()\nfd, chunk = os.memfd_create('hog'), b'\\1' * (8 << 20)\n"
       "for _ in range(int(sys.argv[1]) // len(chunk) + 1):\n    os.write(fd, chunk)\n")
#: How far above the container's usage `oom_kill_pod` sets its limit: enough for its processes' oom_score_adj of
#: 1000 (worth the limit in pages, rounded down to thousands) to outweigh our process's own RSS (an interpreter).
OOM_HEADROOM = 64 << 20
#: The nftables table (family netdev, on the node's end of a pod's veth) that `lose_pod` and `flap_pod` fill.
LOSS_TABLE = "hmw_gray_loss"
#: The nftables table (family ip, in the pod's network namespace) that sends `delay_pod`'s ports to the relay.
DELAY_TABLE = "hmw_gray_delay"
#: How far above a delayed port the relay listens (`devtools.load.delayer`).
DELAY_PORT_OFFSET = 10000


def loss_rules(device: str, percent: int) -> str:
    """An nft script putting `percent` % random loss on `device`, both ways, replacing what it put before.

    The drops are in the netdev family's ingress and egress hooks of the node's end of the pod's veth: past
    the pod's own stack, so its sockets see no error (a drop in the pod's `output` hook would fail its sends
    with EPERM) and the loss is as silent as on a wire. Only IP packets: ARP still resolves, so a dropped
    packet is lost rather than unreachable."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a loss of {percent} %: from 0 to 100")
    drop = ("" if percent == 0 else "meta protocol { ip, ip6 } "
            + ("drop" if percent == 100 else f"numgen random mod 100 < {percent} drop"))
    return "\n".join([
        f"table netdev {LOSS_TABLE}", f"delete table netdev {LOSS_TABLE}", f"table netdev {LOSS_TABLE} {{",
        f'  chain from_pod {{ type filter hook ingress device "{device}" priority 0\n    {drop}\n  }}',
        f'  chain to_pod {{ type filter hook egress device "{device}" priority 0\n    {drop}\n  }}', "}", ""])


def delay_rules(ports: Sequence[int]) -> str:
    """An nft script (for the pod's network namespace) sending connections that reach its eth0 on `ports` to
    the relay's ports; the relay's own connections to 127.0.0.1 come in on lo and pass."""
    rules = "".join(f'\n    iifname "eth0" tcp dport {p} redirect to :{p + DELAY_PORT_OFFSET}' for p in ports)
    return f"table ip {DELAY_TABLE} {{\n  chain pre {{ type nat hook prerouting priority -100{rules}\n  }}\n}}\n"


class NodeCluster:
    """The control plane in the fabric and `nodes` real nodes; single use, like ControlPlane.

    `labels[i]` are extra labels of node i+1 (e.g. `{"mthreads.com/gpu-node": "true"}`), beside its zone.
    `images` are podman images imported into every node's containerd (the chart's by default; none: the
    pause image only, which always is). `version` picks the Kubernetes binaries as `devtools.builds.binaries` does.
    """

    def __init__(self, nodes: int = 3, *, labels: Sequence[Mapping[str, str]] = (), workdir: Path | None = None,
                 version: str | None = None, images: Sequence[str] | None = None,
                 ready_timeout: float = 120.0) -> None:
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        self.size = nodes
        self.extra_labels = list(labels)
        self._parent_dir = workdir
        self.version = version
        self.images = [image.reference()] if images is None else list(images)
        self.ready_timeout = ready_timeout
        self.workdir = Path()
        self.fabric: Namespace | None = None
        self.cp: ControlPlane | None = None
        self.hosts: list[Host] = []
        self.cgroup_root = ""
        #: The pause image, containerd's sandbox image (and a small image for a test pod).
        self.pause = ""
        self._cgroups_made: list[Path] = []
        self.fabric_inode = 0
        self._cuts: dict[tuple[str, str], tuple[Host, str, str, Path]] = {}
        self._relays: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._stopped = False
        #: Seconds from `start()` to every node Ready, and from the kubelets' start to it.
        self.startup_seconds: float | None = None
        self.kubelet_ready_seconds: float | None = None

    # access ------------------------------------------------------------------------------------------------

    @property
    def controlplane(self) -> ControlPlane:
        # the "not started" guard ControlPlane.workdir has too, each with its own error type
        if self.cp is None:
            raise NodeError("the cluster has not been started")
        return self.cp

    @property
    def kubeconfig(self) -> Path:
        return self.controlplane.kubeconfig

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise NodeError(f"no node {name} in this cluster ({', '.join(self.names)})")

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.controlplane.kubectl(*args, **kwargs)

    def in_fabric(self, *cmd: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A command run where the control plane runs (what kube-apiserver reaches, it reaches)."""
        if self.fabric is None:
            raise NodeError("the cluster has not been started")
        return self.fabric.run(*cmd, check=check, timeout=timeout)

    def trust_registry(self, address: str) -> None:
        """Every node's containerd pulls `address` (host:port) over plain HTTP, as a `hosts.toml` in its
        registry config directory tells it (read at each pull: no restart)."""
        for h in self.hosts:
            hosts = h.workdir / "containerd" / "certs.d" / address / "hosts.toml"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(f'server = "http://{address}"\n\n[host."http://{address}"]\n'
                             '  capabilities = ["pull", "resolve"]\n')

    # lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> NodeCluster:
        if self.fabric is not None:
            raise NodeError("a NodeCluster starts once; make a new one")
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
            holders = self.workdir / "holders"
            self.fabric = Namespace(self.workdir, setup=[
                f"ip addr add {pki.SERVICE_IP}/32 dev lo", f"ip addr add {FABRIC_IP}/32 dev lo",
                "echo 1 > /proc/sys/net/ipv4/ip_forward"],
                on_exit=reaper(self.workdir, self.cgroup_root, after=holders)).start()
            self.fabric_inode = self.fabric.inode()
            for i in range(1, self.size + 1):
                labels = self.extra_labels[i - 1] if i <= len(self.extra_labels) else {}
                host = Host(i, self.workdir / f"node{i}", f"{self.cgroup_root}/{node_name(i)}", labels)
                self.hosts.append(host)
                host.make_namespace()
                holders.write_text(" ".join(str(h.ns.pid) for h in self.hosts if h.ns is not None))
                self.fabric.run("sh", "-ec", "\n".join(host.fabric_commands()))
                host.uplink_up()
            self.cp = ControlPlane(bin_dir=bin_dir, workdir=self.workdir, controllers=True,
                                   command_prefix=self.fabric.prefix, reach=self.fabric.forward,
                                   apiserver_port=APISERVER_PORT, node_ip=FABRIC_IP,
                                   ready_timeout=self.ready_timeout)
            self.cp.start()
            self._cgroups_made = make_cgroups(self.cgroup_root)
            for host in self.hosts:
                host.make_cgroups()
                host.start_containerd(pause)
            with concurrent.futures.ThreadPoolExecutor(len(self.hosts)) as pool:  # short children: any thread
                list(pool.map(lambda h: [h.ctr("images", "import", str(a)) for a in archives], self.hosts))
            kubelets_started = time.monotonic()
            assert self.cp._ca is not None
            for host in self.hosts:
                host.start_kubelet(bin_dir, self.cp._ca, self.cp.ca_file, self.cp.minor)
            self.wait_ready()
            self.kubelet_ready_seconds = time.monotonic() - kubelets_started
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def nodes(self) -> dict[str, dict[str, Any]]:
        """The Node objects of this cluster's hosts, by name (those registered)."""
        items = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        return {n["metadata"]["name"]: n for n in items if n["metadata"]["name"] in self.names}

    def ready_status(self, name: str) -> str:
        """The node's Ready condition as the API server has it ("" before it registers)."""
        return _ready(self.nodes().get(name, {}))[0]

    def wait_ready(self, names: Sequence[str] | None = None, timeout: float | None = None,
                   since: float | None = None) -> None:
        """Until the nodes report Ready (kubelet, containerd and CNI all answer; with `since`, a time.time(),
        in a heartbeat kubelet sent after it: a revived node's Ready left from before its death does not
        count) and namespace `default` has its ServiceAccount (a pod created before the controller makes it
        is refused)."""
        names = list(names or self.names)
        waiting: list[str] = []

        def ready() -> bool:
            nodes = self.nodes()
            waiting[:] = [n for n in names if _ready(nodes.get(n, {}))[0] != "True"
                          or (since is not None and _ready(nodes[n])[1] < int(since))]
            if not waiting and self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                            check=False).returncode == 0:
                return True
            for name in waiting:
                host = self.host(name)
                if host.kubelet is not None and host.kubelet.poll() is not None:
                    raise NodeError(f"kubelet of {name} exited with {host.kubelet.returncode}; end of its log:\n"
                                    f"{tail(host.workdir / 'kubelet.log')}")
            return False

        def not_ready(message: str) -> NodeError:
            logs = "\n".join(f"{n}:\n{tail(self.host(n).workdir / 'kubelet.log', 15)}" for n in waiting)
            return NodeError(f"{message} ({', '.join(waiting) or 'the default ServiceAccount'} not yet); "
                             f"end of kubelet's log:\n{logs}")

        until(f"nodes {', '.join(names)} Ready", ready, timeout or self.ready_timeout, 0.5, fail=not_ready)

    def lease_renewed(self, name: str) -> float:
        """When the node's kubelet last renewed its Lease (a time.time()): it stops moving when the node dies."""
        renew = self.kubectl("get", "lease", name, "-n", "kube-node-lease", "-o",
                             "jsonpath={.spec.renewTime}").stdout.strip()
        whole, _, fraction = renew.rstrip("Z").partition(".")
        return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")

    def pod_memory(self, namespace: str) -> dict[str, int]:
        """Each running pod's working set in bytes (usage less inactive file pages, as kubelet counts it),
        read from its memory cgroup: kubelet's own summary has no figures for pods under a nested cgroup
        root on cgroup v1."""
        pods = json.loads(self.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        memory = next(h for h in hierarchies() if (h / "memory.usage_in_bytes").exists())
        root = memory / self.cgroup_root.lstrip("/")
        out = {}
        for pod in pods:
            if pod["spec"].get("nodeName") not in self.names or pod["status"].get("phase") != "Running":
                continue
            found = next(root.rglob(f"pod{pod['metadata']['uid']}"), None)
            if found is None:
                continue
            usage = int((found / "memory.usage_in_bytes").read_text())
            stat = dict(line.split() for line in (found / "memory.stat").read_text().splitlines())
            out[pod["metadata"]["name"]] = max(0, usage - int(stat.get("total_inactive_file", 0)))
        return out

    # faults: nodes -----------------------------------------------------------------------------------------

    def kill_node(self, name: str) -> None:
        """The node dies whole, silently, without a goodbye (`Host.kill` says how)."""
        self.host(name).kill()

    def revive_node(self, name: str, wait: bool = True, timeout: float | None = None) -> None:
        """The killed node powered on again (`Host.revive`); with `wait`, until kubelet has reported it Ready."""
        since = time.time()
        self.host(name).revive()
        if wait:
            self.wait_ready([name], timeout=timeout, since=since)

    def restart_kubelet(self, name: str, wait: bool = True) -> None:
        """kubelet of the node SIGTERMed and started again; its pods keep running meanwhile."""
        since = time.time()
        self.host(name).restart_kubelet()
        if wait:
            self.wait_ready([name], since=since)

    def restart_containerd(self, name: str) -> None:
        """containerd of the node SIGTERMed and started again; the shims and containers keep running."""
        self.host(name).restart_containerd()

    # faults: a pod's container -----------------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout))

    def container_status(self, namespace: str, name: str, container: str | None = None) -> dict[str, Any]:
        """kubelet's status of the pod's container (the first unless named); {} before it reports one."""
        statuses = self.pod(namespace, name)["status"].get("containerStatuses") or []
        return dict(next((s for s in statuses if container in (None, s["name"])), {}))

    def container_cgroup(self, namespace: str, name: str, container: str | None = None) -> tuple[Host, Path]:
        """The node of a running pod and its container's memory cgroup (the first container unless named),
        found from the pod's UID and the container's ID."""
        pod = self.pod(namespace, name)
        status: dict[str, Any] = next((s for s in pod["status"].get("containerStatuses") or []
                                       if container in (None, s["name"])), {})
        if "running" not in status.get("state", {}):
            raise NodeError(f"pod {namespace}/{name} has no running container {container or ''}".rstrip())
        host = self.host(pod["spec"]["nodeName"])
        return host, host.container_cgroup(pod["metadata"]["uid"], status["containerID"].split("://")[-1])

    def container_processes(self, namespace: str, name: str, container: str | None = None) -> set[int]:
        """The PIDs of the container's processes, read from its cgroup."""
        return cgroup_pids([self.container_cgroup(namespace, name, container)[1]])

    def freeze_pod(self, namespace: str, name: str, container: str | None = None) -> set[int]:
        """SIGSTOP to every process of the container, returning once all are stopped (a signal is delivered
        when the process is next scheduled): it stays, holds its sockets and answers nothing (the kernel still
        completes TCP handshakes into its listen backlog); its probes time out. Returns the PIDs."""
        pids = self.container_processes(namespace, name, container)
        signal_all(pids, signal.SIGSTOP)
        _until_state(pids, lambda state: state in "TZ")
        return pids

    def thaw_pod(self, namespace: str, name: str, container: str | None = None) -> None:
        """SIGCONT to every process of the container, returning once none is stopped: it goes on where it
        stopped."""
        pids = self.container_processes(namespace, name, container)
        signal_all(pids, signal.SIGCONT)
        _until_state(pids, lambda state: state != "T")

    def kill_pod(self, namespace: str, name: str, container: str | None = None) -> None:
        """SIGKILL to every process of the container, as a crash: the kernel closes its sockets (peers get RST
        on their next segment), containerd's shim reports the exit, kubelet restarts the container (exit
        code 137, reason Error)."""
        signal_all(self.container_processes(namespace, name, container), signal.SIGKILL)

    def cut_pod(self, namespace: str, name: str, seconds: float | None = None) -> None:
        """The pod's network cut silently, both ways; restored after `seconds` (blocking), or by `restore_pod`.

        The host's end of the pod's veth is set down: the bridge stops forwarding to and from that port
        (frames for the pod's MAC are flooded to the other ports, which drop them), and the pod's own end
        loses its carrier, so what the pod sends is dropped by its queue discipline (noop while the carrier
        is off). Before that, the node's neighbour entry for the pod and the pod's for its node (its gateway)
        are made permanent: else their ARP would fail within seconds, and the node would answer the fabric's
        packets for the pod with ICMP host unreachable, the pod's own connects would fail with EHOSTUNREACH.
        So kube-apiserver, the other nodes' pods and the pod itself see timeouts; kubelet's probes too. Pods
        on the same node still resolve the pod's address themselves and get EHOSTUNREACH once their ARP
        fails: a cut seen from the same node is not silent."""
        pod = self.pod(namespace, name)
        host, cgroup, netns, mac, veth = self._veth(namespace, name)
        bridge = re.search(r"link/ether (\S+)", host.inside("ip", "-o", "link", "show", BRIDGE).stdout)
        if bridge is None:
            raise NodeError(f"node {host.name}: no bridge {BRIDGE}")
        ip = pod["status"]["podIP"]
        subprocess.run(["nsenter", f"--net={netns}", "ip", "neigh", "replace", host.ip, "lladdr", bridge[1], "dev",
                        "eth0", "nud", "permanent"], check=True, timeout=30)
        host.inside("sh", "-ec", f"ip neigh replace {ip} lladdr {mac} dev {BRIDGE} nud permanent\n"
                                 f"ip link set {veth} down")
        self._cuts[(namespace, name)] = (host, veth, ip, cgroup.parent)
        if seconds is not None:
            time.sleep(seconds)
            self.restore_pod(namespace, name)

    def _veth(self, namespace: str, name: str) -> tuple[Host, Path, str, str, str]:
        """A running pod's node, its container's cgroup, its network namespace's file, its eth0's MAC and the
        name of the node's end of its veth."""
        host, cgroup = self.container_cgroup(namespace, name)
        netns = f"/proc/{min(cgroup_pids([cgroup]))}/ns/net"
        link = subprocess.run(["nsenter", f"--net={netns}", "ip", "-o", "link", "show", "eth0"], capture_output=True,
                              text=True, check=True, timeout=30).stdout
        found = re.search(r"eth0@if(\d+):.*link/ether (\S+)", link)
        veth = re.search(rf"^{found[1] if found else '-'}: ([^:@]+)", host.inside("ip", "-o", "link").stdout, re.M)
        if found is None or veth is None:
            raise NodeError(f"pod {namespace}/{name}: no veth found ({link!r})")
        return host, cgroup, netns, found[2], veth[1]

    def lose_pod(self, namespace: str, name: str, percent: int) -> None:
        """`percent` % of the pod's IP packets dropped at random, both ways, silently (`loss_rules`), until
        `heal_pod` (or another call, which replaces the share)."""
        host, _cgroup, _netns, _mac, veth = self._veth(namespace, name)
        host.inside("nft", loss_rules(veth, percent))

    def flap_pod(self, namespace: str, name: str, seconds: float, down: float = 1.0, up: float = 2.0) -> None:
        """The pod's link down for `down` seconds and up for `up`, in turn, for `seconds` (blocking), as a
        flapping port: every packet lost while down (`lose_pod` at 100 %), none while up; healed after."""
        host, _cgroup, _netns, _mac, veth = self._veth(namespace, name)
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                host.inside("nft", loss_rules(veth, 100))
                time.sleep(min(down, max(0.0, end - time.monotonic())))
                host.inside("nft", loss_rules(veth, 0))
                time.sleep(min(up, max(0.0, end - time.monotonic())))
        finally:
            self.heal_pod(namespace, name)

    def delay_pod(self, namespace: str, name: str, seconds: float, ports: Sequence[int]) -> None:
        """What the pod sends from `ports` held `seconds` before it leaves, until `heal_pod`: connections that
        reach its eth0 on those ports are redirected to a relay in its network namespace (`devtools.load.delayer`:
        this kernel has no `sch_netem`).

        NAT decides once per connection, so one open before the redirect would bypass the relay for as long as
        it lives (a peer's or kube-apiserver's kept-alive one: the fault would reach some callers and not
        others). Those are aborted (`ss -K`, a reset to the caller) once the redirect is in place, and every
        caller meets the delay on its next connection, as all would behind a slow link."""
        _host, _cgroup, netns, _mac, _veth = self._veth(namespace, name)
        pairs = [f"{p + DELAY_PORT_OFFSET}:{p}" for p in ports]
        relay = subprocess.Popen(["nsenter", f"--net={netns}", sys.executable, "-m", "devtools.load.delayer", "--delay",
                                  str(seconds), *pairs], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                                 preexec_fn=die_with_parent())
        self._relays[(namespace, name)] = relay
        assert relay.stdout is not None
        if relay.stdout.readline().strip() != b"ready":
            self.heal_pod(namespace, name)
            raise NodeError(f"pod {namespace}/{name}: the delaying relay did not start")
        subprocess.run(["nsenter", f"--net={netns}", "nft", delay_rules(ports)], check=True, timeout=30)
        served = " or ".join(f"sport = :{p}" for p in ports)
        subprocess.run(["nsenter", f"--net={netns}", "ss", "-K", "-tn", "state", "established",
                        f"( {served} ) and not dst 127.0.0.1"], check=True, capture_output=True, timeout=30)

    def heal_pod(self, namespace: str, name: str) -> None:
        """Undo `lose_pod`, `flap_pod` and `delay_pod` on the pod: its loss table and redirect gone, its relay
        stopped (connections it held are cut, as a link's recovery would not, but they are few)."""
        host, _cgroup, netns, _mac, _veth = self._veth(namespace, name)
        host.inside("nft", "delete", "table", "netdev", LOSS_TABLE, check=False)
        subprocess.run(["nsenter", f"--net={netns}", "nft", "delete", "table", "ip", DELAY_TABLE],
                       capture_output=True, timeout=30)
        if (relay := self._relays.pop((namespace, name), None)) is not None:
            relay.kill()
            relay.wait()

    def restore_pod(self, namespace: str, name: str) -> None:
        """The cut pod's veth up again, and the neighbour entries on both sides learnt again (from any process
        of the pod, its sandbox's if its container was restarted meanwhile)."""
        host, veth, ip, pod_cgroup = self._cuts.pop((namespace, name))
        host.inside("sh", "-ec", f"ip link set {veth} up\nip neigh del {ip} dev {BRIDGE} || true")
        if pids := cgroup_pids([pod_cgroup]):
            subprocess.run(["nsenter", f"--net=/proc/{min(pids)}/ns/net", "ip", "neigh", "del", host.ip, "dev", "eth0"],
                           capture_output=True, timeout=30)

    def oom_kill_pod(self, namespace: str, name: str, container: str | None = None,
                     timeout: float = 60.0) -> dict[str, Any]:
        """An OOM kill under the container's own memory limit, by the kernel's OOM killer; returns the
        terminated state kubelet reports (reason OOMKilled).

        cgroup v1 refuses a memory limit below what a cgroup cannot give back (the write fails with EBUSY;
        v2 would OOM-kill at once), so: the container's `memory.limit_in_bytes` is lowered to its usage plus
        OOM_HEADROOM (never raised), its processes' `oom_score_adj` raised to 1000 (raising needs no
        privilege; the kernel adds the limit's size in pages to their badness, so they are its first
        choice), and a process of ours joins its memory cgroup and writes into a memfd until the cgroup is
        out of memory. The kernel's memcg OOM killer kills the container's main process (its pid namespace,
        and so the container, ends), then ours, the only one left still charging; containerd's shim hears
        the cgroup's OOM event, so kubelet reports OOMKilled and restarts the container in a new cgroup,
        with the pod's limit."""
        _host, cgroup = self.container_cgroup(namespace, name, container)
        before = self._terminations(namespace, name, container)
        for pid in cgroup_pids([cgroup]):
            Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
        usage, limit = (int((cgroup / f).read_text()) for f in ("memory.usage_in_bytes", "memory.limit_in_bytes"))
        limit = min(limit, usage + OOM_HEADROOM)
        (cgroup / "memory.limit_in_bytes").write_text(str(limit))
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(2 * limit)], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=die_with_parent())
        try:
            (cgroup / "cgroup.procs").write_text(str(hog.pid))
            assert hog.stdin is not None
            hog.stdin.write(b"go\n")
            hog.stdin.close()
            hog.wait(timeout)
        finally:
            if hog.poll() is None:
                hog.kill()
                hog.wait()

        def reported() -> dict[str, Any] | None:
            after = self._terminations(namespace, name, container)
            return after if after != before else None

        return until(f"kubelet reporting a new termination of {namespace}/{name} after the OOM kill", reported,
                     timeout, 0.25, fail=NodeError)

    def _terminations(self, namespace: str, name: str, container: str | None) -> dict[str, Any]:
        """The container's last termination kubelet reported (its current state if it is terminated)."""
        status = self.container_status(namespace, name, container)
        return dict(status.get("state", {}).get("terminated") or status.get("lastState", {}).get("terminated")
                    or {})

    # stopping ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything, by PID, and remove the cgroups, the namespaces and the work dir. Safe twice."""
        if self._stopped:
            return
        self._stopped = True
        live = [h for h in self.hosts if h.kubelet is not None and h.kubelet.poll() is None]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(self.hosts))) as pool:
            if self.cp is not None and live:
                # kubelet stops the pods' containers and unmounts their volumes itself.
                list(pool.map(lambda h: self.kubectl(
                    "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={h.name}",
                    "--grace-period=1", "--wait=true", "--timeout=30s", check=False, timeout=45), live))
            list(pool.map(Host.stop, self.hosts))
        if self.cp is not None:
            self.cp.stop()
        if self.fabric is not None:
            self.fabric.stop()
        dirs = [h / self.cgroup_root.lstrip("/") for h in hierarchies(unified=True)] if self.cgroup_root else []
        remove_cgroups(dirs, self._cgroups_made)
        if self.workdir != Path():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def leftovers(self) -> dict[str, list[str]]:
        """What of the cluster is still on the machine (nothing, after `stop()`)."""
        return leftovers(self.workdir, self.cgroup_root, self.fabric_inode, *(h.netns_inode for h in self.hosts))


def _until_state(pids: set[int], ok: Callable[[str], bool], timeout: float = 10.0) -> None:
    """Until every process's state (/proc/PID/stat: R, S, T, Z, ...) is `ok`, or it is gone."""
    until(f"processes {sorted(pids)} in the state asked for", lambda: all(ok(process_state(p)) for p in pids),
          timeout, 0.01, fail=NodeError)


def _ready(obj: Mapping[str, Any]) -> tuple[str, int]:
    """A Node's Ready status and the time of its last heartbeat (seconds since the epoch)."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            beat = calendar.timegm(time.strptime(c["lastHeartbeatTime"], "%Y-%m-%dT%H:%M:%SZ"))
            return c["status"], beat
    return "", 0


# --- `python -m devtools.clusters.nodes up` ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.clusters.nodes", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the nodes and the control plane, print the kubeconfig, stop on Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args(argv)
    stopping = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: stopping.set())
    cluster = NodeCluster(args.nodes)
    try:
        cluster.start()
        print(f"nodes {', '.join(cluster.names)} Ready in {cluster.startup_seconds:.1f}s", file=sys.stderr)
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        stopping.wait()
        return 0
    except ControlPlaneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
