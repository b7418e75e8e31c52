"""A NetworkPolicy implementation on the node tier: kube-network-policies on every node of a `NodeCluster`.

Kubernetes stores NetworkPolicies but enforces none: that is the network plugin's job, and the node tier's
CNI (a bridge, routing only) has none. So a NetworkPolicy for the webhook's pods is only proven where
something enforces it; here that is sigs.k8s.io/kube-network-policies (the implementation kind uses),
built by scripts/build-kube-network-policies.sh and run as kind runs it, one per node, but as a process
of the node (as kubelet is) rather than a DaemonSet pod:

- in the node's network and mount namespace (`Host.ns.prefix`): it programs nftables there (a table
  `kube-network-policies`, inet family, on the prerouting and postrouting hooks), and every packet of a
  node's pods passes through that namespace: routed to the fabric and the other nodes, or bridged on
  `hmw0` between pods of the same node, which the IP hooks see because br_netfilter is in the kernel and
  `bridge-nf-call-iptables` is 1 (set here, per namespace). New connections from or to a pod of the
  node that a NetworkPolicy selects (a set of their IPs, kept in step with pods and policies) go to
  nfqueue 100, where it gives its verdict from the NetworkPolicies it watches; others pass unjudged;
- logged in as the user `hami-mt:kube-network-policies` (a client certificate, at the `kubernetes`
  Service's cluster IP, as kubelet is), with the rights of upstream's ClusterRole: read pods, namespaces,
  nodes and NetworkPolicies (`RBAC`);
- with `--hostname-override` the node's name (it enforces for the pods of that node only), metrics on
  the node's loopback only, and fail-closed (no `--fail-open`: with it stopped, or dead, queued packets are
  dropped; its table stays until it is stopped by SIGTERM). Its NRI plugin finds no socket (containerd 1.6
  has no NRI), so pod IPs come from the API server alone: a pod's first packets before its IP is
  published are judged without it, as upstream documents.

Its processes are in the node's network namespace, so they belong to the node (`Host.processes`): a
`kill_node` kills them with the node and `NodeCluster.stop` stops them; `revive_node` and `restart_*` do not
start them again (`Enforcer.restart(host)` does).

    python -m devtools.clusters.netpol proof     (make netpol-proof) a 2-node cluster, the enforcer, policies checked
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devtools import pki
from devtools.builds import image
from devtools.clusters.host import APISERVER_PORT, FABRIC_IP, Host
from devtools.clusters.nodes import NodeCluster
from devtools.paths import REPO_ROOT
from devtools.procs import spawn, tail, terminate
from devtools.waiting import until

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kube-network-policies.sh"
NAME = "kube-network-policies"
USER = "hami-mt:kube-network-policies"
#: How `Enforcer.wait` sees a node's table (it shows the xtables NFQUEUE target as `queue num N`).
NFT = "/usr/sbin/nft"
PROBE_SOURCE = REPO_ROOT / "controlplane" / "commands" / "netprobe"
#: Upstream's ClusterRole (install.yaml of v0.8.0), bound to our user.
RBAC = f"""\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {USER}
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes]
  verbs: [list, watch, get]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {USER}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {USER}
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {USER}
"""


class NetpolError(RuntimeError):
    """kube-network-policies could not be built or started."""


def binary() -> Path:
    """The kube-network-policies binary, built once by the build script (progress to our stderr)."""
    proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    last: collections.deque[str] = collections.deque(maxlen=40)
    for line in proc.stderr:
        last.append(line)
        with contextlib.suppress(OSError):
            sys.stderr.write(line)
    out = proc.stdout.read().strip()
    if proc.wait() != 0 or not out:
        raise NetpolError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}:\n{''.join(last)}")
    path = Path(out.splitlines()[-1]) / NAME
    if not path.is_file():
        raise NetpolError(f"{BUILD_SCRIPT} names {path.parent}, which has no {NAME}")
    return path


def probe_image() -> str:
    """The probe pods' image (controlplane/commands/netprobe), built once per state of its source, FROM scratch."""
    return image.go_command(PROBE_SOURCE, "hami-mt-netprobe")


class Enforcer:
    """kube-network-policies on every node of a started `cluster`; `start()` returns once each has loaded
    its nftables table and bound its queue."""

    def __init__(self, cluster: NodeCluster, *, fail_open: bool = False, queue: int = 100) -> None:
        self.cluster = cluster
        self.fail_open = fail_open
        self.queue = queue
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._cmd: list[str] = []

    def start(self, timeout: float = 60.0) -> Enforcer:
        if not os.access(NFT, os.X_OK):
            raise NetpolError(f"{NFT} is missing: `make netpol-tools` installs Debian's nftables")
        cp = self.cluster.controlplane
        self.cluster.kubectl("apply", "-f", "-", input=RBAC)
        assert cp._ca is not None
        kubeconfig = pki.user_kubeconfig(self.cluster.workdir, cp._ca,
                                         f"https://{pki.SERVICE_IP}:{APISERVER_PORT}", USER)
        self._cmd = [str(binary()), f"--kubeconfig={kubeconfig}", f"--nfqueue-id={self.queue}",
                     "--metrics-bind-address=127.0.0.1:9080", "--v=2",
                     *(["--fail-open"] if self.fail_open else [])]
        for host in self.cluster.hosts:
            self._start(host)
        for host in self.cluster.hosts:
            self.wait(host, timeout)
        return self

    def _start(self, host: Host) -> None:
        assert host.ns is not None
        # Bridged packets (pod to pod on one node) through the IP hooks, in this namespace only.
        host.inside("sh", "-ec", "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables; "
                    "echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables")
        self.procs[host.name] = spawn([*host.ns.prefix, *self._cmd, f"--hostname-override={host.name}"],
                                      self.log(host))

    def log(self, host: Host) -> Path:
        return host.workdir / f"{NAME}.log"

    def wait(self, host: Host, timeout: float = 60.0) -> None:
        """Until the node's table is loaded and its queue bound (/proc/net/netfilter/nfnetlink_queue)."""
        proc = self.procs[host.name]
        table, queues = False, [""]

        def bound() -> bool:
            nonlocal table, queues
            if proc.poll() is not None:
                raise NetpolError(f"{NAME} on {host.name} exited with {proc.returncode}:\n{tail(self.log(host))}")
            table = host.inside(NFT, "list", "table", "inet", NAME, check=False).returncode == 0
            queues = host.inside("cat", "/proc/net/netfilter/nfnetlink_queue", check=False).stdout.split()
            return table and queues[:1] == [str(self.queue)]

        until(f"{NAME} on {host.name} loaded and bound", bound, timeout, 0.5, fail=lambda m: NetpolError(
            f"{m}: table loaded {table}, queues {queues}:\n{tail(self.log(host))}"))

    def restart(self, host: Host) -> None:
        """Start it again on `host` (after `revive_node`, or to see a restart)."""
        old = self.procs.get(host.name)
        if old is not None:
            terminate(old)
        self._start(host)
        self.wait(host)

    def check(self) -> None:
        """Raise if one has exited (it does not restart itself; its node then drops what it queues)."""
        for host in self.cluster.hosts:
            proc = self.procs[host.name]
            if proc.poll() is not None:
                raise NetpolError(f"{NAME} on {host.name} exited with {proc.returncode}:\n{tail(self.log(host))}")

    def stop(self) -> None:
        for proc in self.procs.values():
            terminate(proc, grace=10)


# --- the proof: `python -m devtools.clusters.netpol proof` --------------------------------------------------------

POLICY_DENY = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: np-server}
spec:
  podSelector: {}
  policyTypes: [Ingress]
"""


def _allow(name: str, peer: dict[str, Any]) -> str:
    """A NetworkPolicy letting `peer` (one `from` entry) reach np-server's servers on port 8080."""
    return json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": name, "namespace": "np-server"},
                       "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"],
                                "ingress": [{"from": [peer], "ports": [{"port": 8080, "protocol": "TCP"}]}]}})


POLICY_ALLOW = _allow("allow-client", {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "np-client"}},
    "podSelector": {"matchLabels": {"app": "client"}}})
POLICY_FABRIC = _allow("allow-fabric", {"ipBlock": {"cidr": f"{FABRIC_IP}/32"}})
#: One connection from the fabric, where kube-apiserver runs (its calls to pods come from FABRIC_IP).
FABRIC_DIAL = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 8080), timeout=0.8).recv(3)\n"
               "    print('ok')\nexcept OSError as e:\n    print('fail', e)\n")


def _fabric_dials(cluster: NodeCluster, ips: list[str], times: int = 4) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(times):
        for ip in ips:
            out = cluster.in_fabric("python3", "-c", FABRIC_DIAL, ip).stdout.strip()
            counts[f"fabric->{ip} {out or '?'}"] += 1
        time.sleep(0.2)
    return counts


def _pod(namespace: str, name: str, node_name: str, probe: str, args: list[str]) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name.split("-")[0]}},
        "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "probe", "image": probe, "imagePullPolicy": "Never", "args": args,
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}})


def _results(cluster: NodeCluster, namespace: str, pod: str, since: float) -> collections.Counter[str]:
    """ok/fail counts per target in the probe's log lines stamped at or after `since` (unix seconds)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in cluster.kubectl("logs", "-n", namespace, pod).stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and float(parts[0]) >= since:
            counts[f"{parts[1]} {parts[2]}"] += 1
    return counts


def _enforcer_log(enforcer: Enforcer, host: Host) -> str:
    return enforcer.log(host).read_text(errors="replace")


def proof(window: float = 8.0) -> int:
    """Two nodes; a server pod in np-server on each node, a client pod in np-client on node 1 that connects
    to both servers (one on its node, bridged; one across, routed) every second. Open, then default-deny
    on np-server, then an allow for np-client's client; then connections from the fabric (where
    kube-apiserver runs), refused, then let in by an ipBlock for its address. Prints what each phase saw;
    0 when each is as expected."""
    probe = probe_image()
    with NodeCluster(2, images=[probe]) as cluster:
        started = time.monotonic()
        enforcer = Enforcer(cluster).start()
        print(f"cluster up in {cluster.startup_seconds:.1f} s; {NAME} loaded and bound on "
              f"{len(cluster.hosts)} nodes {time.monotonic() - started:.1f} s later", flush=True)
        try:
            n1, n2 = cluster.names
            k = cluster.kubectl
            for ns in ("np-server", "np-client"):
                k("create", "namespace", ns)
            # pods are admitted once the namespace's ServiceAccount exists
            until("the default ServiceAccount in np-server and np-client",
                  lambda: not any(k("get", "serviceaccount", "-n", ns, "default", check=False).returncode
                                  for ns in ("np-server", "np-client")), 60, 0.5, fail=NetpolError)
            k("apply", "-f", "-", input=_pod("np-server", "server-1", n1, probe, []))
            k("apply", "-f", "-", input=_pod("np-server", "server-2", n2, probe, []))
            k("wait", "-n", "np-server", "--for=condition=Ready", "pod", "--all", "--timeout=120s", timeout=130)
            ips = {p: k("get", "pod", "-n", "np-server", p, "-o", "jsonpath={.status.podIP}").stdout
                   for p in ("server-1", "server-2")}
            targets = [f"{ips['server-1']}:8080", f"{ips['server-2']}:8080"]
            k("apply", "-f", "-", input=_pod("np-client", "client-1", n1, probe, targets))
            k("wait", "-n", "np-client", "--for=condition=Ready", "pod/client-1", "--timeout=120s", timeout=130)
            print(f"servers {ips} (server-1 on {n1}, server-2 on {n2}); client-1 on {n1}", flush=True)
            expected = {"open": "ok", "default-deny": "fail", "allow np-client": "ok"}
            failed = 0
            for phase, apply in (("open", None), ("default-deny", POLICY_DENY), ("allow np-client", POLICY_ALLOW)):
                if apply:
                    k("apply", "-f", "-", input=apply)
                time.sleep(2)  # the informers see the policy; connections already judged are left alone
                since = time.time()
                time.sleep(window)
                seen = _results(cluster, "np-client", "client-1", since)
                ok = all(seen.get(f"{t} {expected[phase]}", 0) > 0 and
                         sum(v for key, v in seen.items() if key.startswith(t)) == seen[f"{t} {expected[phase]}"]
                         for t in targets)
                # kubelet's probes come from the node's own processes (root: upstream's rules let them by).
                ready = k("get", "pods", "-n", "np-server", "-o",
                          "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}").stdout.split()
                ok = ok and ready == ["True", "True"]
                failed += not ok
                print(f"{phase}: {dict(seen)}, servers Ready {ready} -> {'as expected' if ok else 'NOT as expected'}",
                      flush=True)
            # What kube-apiserver's calls to a webhook's pods go through: from the fabric, routed by the nodes.
            for phase, apply, want in (("fabric, before an ipBlock for it", None, "fail"),
                                       (f"fabric, ipBlock {FABRIC_IP}/32", POLICY_FABRIC, "ok")):
                if apply:
                    k("apply", "-f", "-", input=apply)
                    time.sleep(2)
                seen = _fabric_dials(cluster, list(ips.values()))
                ok = all(key.split()[1] == want for key in seen)
                failed += not ok
                print(f"{phase}: {dict(seen)} -> {'as expected' if ok else 'NOT as expected'}", flush=True)
            try:
                enforcer.check()
            except NetpolError as e:
                failed += 1
                print(e, flush=True)
            for host in cluster.hosts:
                verdicts = collections.Counter(
                    line.rsplit("verdict=", 1)[1].strip().strip('"') for line in
                    _enforcer_log(enforcer, host).splitlines() if "Finished syncing packet" in line)
                # nft shows the xtables target as `queue num N`; its netlink debug names what the kernel holds.
                kernel = [line.strip() for line in host.inside(
                    NFT, "--debug=netlink", "list", "table", "inet", NAME).stdout.splitlines()
                    if "target name" in line or "queue" in line and "[" in line]
                print(f"--- {host.name}: verdicts {dict(verdicts)}; queue rules as the kernel holds them: "
                      f"{collections.Counter(kernel)}", flush=True)
            return 1 if failed else 0
        finally:
            enforcer.stop()


if __name__ == "__main__":
    if sys.argv[1:] != ["proof"]:
        sys.exit(__doc__)
    sys.exit(proof())
