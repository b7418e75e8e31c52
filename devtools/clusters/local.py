"""The webhook as a local process beside a local control plane: `make run` and the end-to-end tests.

The shipped manifests are applied through a local overlay (same rules, selectors, matchConditions and
timeouts; only the clientConfig points at 127.0.0.1), and the webhook logs in with a token of the
shipped ServiceAccount, so the shipped ClusterRole and binding are what it runs with.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from devtools import gpus, procs
from devtools.builds.binaries import ControlPlaneError
from devtools.clusters import manifests, monitoring
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.nodes import NodeCluster
from devtools.paths import CHART, RUN_DIR
from hami_mt_webhook.service import certs

NAMESPACE = "hami-mt-webhook"
SERVICE_ACCOUNT = "hami-mt-webhook"
#: The chart, and the release name the README's Helm section installs it under.
RELEASE = "hami-mt-webhook"


def helm(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """The built helm against the local control plane, its cache and config kept in the run directory."""
    home = cp.workdir / "helm"
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    done = subprocess.run([str(cp.bin_dir / "helm"), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done


def apply_nodes(cp: ControlPlane, nodes: Iterable[dict[str, Any]]) -> list[str]:
    """Create Node objects (metadata, and spec such as taints) and set their capacity through the status
    subresource, as kubelet would."""
    names = []
    for node in nodes:
        meta = {k: v for k, v in node["metadata"].items() if k in ("name", "labels")}
        obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        if node.get("spec"):
            obj["spec"] = node["spec"]
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
        capacity = (node.get("status") or {}).get("capacity") or {}
        status = {"status": {"capacity": capacity, "allocatable": capacity}}
        cp.kubectl("patch", "node", meta["name"], "--subresource=status", "--type=merge", "-p",
                   yaml.safe_dump(status))
        names.append(meta["name"])
    return names


def example_nodes() -> list[dict[str, Any]]:
    """The example S4000 and S5000 nodes (examples/nodes.yaml), and a node with whole cards only."""
    return [*gpus.example_nodes(), gpus.whole_card_node()]


#: The taint on the example nodes beside a real one: no kubelet runs them.
NO_KUBELET = "hami-mt.example/no-kubelet"
#: The chart's image as containerd names the image `make image` built and the node imported.
NODE_IMAGE_REPOSITORY = "localhost/hami-mt-webhook"
REPLICAS = 3


def tainted_example_nodes() -> list[dict[str, Any]]:
    """The example nodes, as Node objects beside the real one: capacity for the webhook to read. No kubelet
    runs them, so a NoSchedule taint keeps every pod that does not ask for them (the chart's) off them."""
    nodes = example_nodes()
    for n in nodes:
        spec = n.setdefault("spec", {})
        spec["taints"] = [*(spec.get("taints") or []), {"key": NO_KUBELET, "effect": "NoSchedule"}]
    return nodes


def replicas(cluster: NodeCluster, *, terminating: bool = False) -> list[dict[str, Any]]:
    """The chart's webhook pods; those being deleted (still serving through their preStop) only if asked."""
    out = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=hami-mt-webhook",
                          "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if terminating or not p["metadata"].get("deletionTimestamp")]


def scrape(cluster: NodeCluster, pod: dict[str, Any]) -> str:
    """A replica's metrics, through the API server's pod proxy ("" when it does not answer)."""
    return cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}:9090"
                           "/proxy/metrics", check=False).stdout


def ready_replicas(node: NodeCluster) -> int:
    out = node.kubectl("get", "deployment", RELEASE, "-n", NAMESPACE, "-o",
                       "jsonpath={.status.readyReplicas}", check=False).stdout.strip()
    return int(out or 0)


def install_chart_on_node(node: NodeCluster, timeout: float = 180.0, values: Sequence[str] = (),
                          chart: Sequence[str] | None = None) -> float:
    """The chart installed on real nodes as the README's Install section says, with its defaults (and
    `values`, `key=value` for `--set`): the namespace made and labelled, the tainted example nodes,
    `helm install`, and the wait for its replicas Ready through their probes. One home for the node tier,
    the release tier and `make run NODE=1`/`NODES=3`; returns the seconds from `helm install` to Ready.

    `chart` is what `helm install` takes after the release name (e.g. `oci://…`, `--version`, `--plain-http`);
    by default this tree's chart with the image built here."""
    node.kubectl("create", "namespace", NAMESPACE)
    node.kubectl("label", "namespace", NAMESPACE, "hami.io/webhook=ignore",
                 "pod-security.kubernetes.io/enforce=restricted")
    apply_nodes(node.controlplane, tainted_example_nodes())
    started = time.monotonic()
    source = chart if chart is not None else [str(CHART), "--set", f"image.repository={NODE_IMAGE_REPOSITORY}"]
    helm(node.controlplane, "install", RELEASE, *source, "-n", NAMESPACE,
         *(a for v in values for a in ("--set", v)))
    while ready_replicas(node) != REPLICAS:
        if time.monotonic() > started + timeout:
            pods = node.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout
            events = node.kubectl("get", "events", "-n", NAMESPACE).stdout[-4000:]
            raise RuntimeError(f"{REPLICAS} replicas not Ready {timeout:.0f} s after helm install:\n"
                               f"{pods}\n{events}")
        time.sleep(0.25)
    return time.monotonic() - started


class LocalWebhook:
    """`hami-mt-webhook serve` in its own process, registered with the local API server."""

    def __init__(self, cp: ControlPlane, workdir: Path, *, port: int | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 certs_dir: Path | None = None, api_server: str | None = None) -> None:
        self.cp = cp
        self.api_server = api_server or cp.server  # where it watches Nodes (a test may put a proxy between)
        self.workdir = Path(workdir)
        self.port, self.health_port, self.metrics_port = procs.free_ports(3)
        self.port = port or self.port
        #: Where the probe listener is: a test of several replicas gives each a loopback address of its own.
        self.health_host = "127.0.0.1"
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        dns, ips = certs.split_sans(certs.LOCAL_SANS)  # the webhook is reached on loopback
        self.certs = certs.ensure(certs_dir or self.workdir / "certs", extra_dns=dns, ips=ips)
        self.log = self.workdir / f"webhook-{self.port}.log"
        self.kubeconfig = self.workdir / "webhook.kubeconfig"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def install(self, url: str | None = None) -> None:
        """Apply the manifests' local overlay (calling `url`, by default this process) and write a
        kubeconfig for the shipped ServiceAccount."""
        overlay = manifests.local_overlay(self.workdir / "overlay", url or self.url,
                                          self.certs.bundle.read_bytes())
        self.cp.kubectl("apply", "-k", str(overlay))
        self.login()

    def install_chart(self) -> None:
        """Install the Helm chart instead (`make run INSTALL=helm`), as the README's Helm section does: the
        namespace made and labelled first, then the release, its webhooks calling this process (the chart's
        `development` values) and the webhook logged in as the chart's ServiceAccount."""
        self.cp.kubectl("create", "namespace", NAMESPACE)
        self.cp.kubectl("label", "namespace", NAMESPACE, "hami.io/webhook=ignore",
                        "pod-security.kubernetes.io/enforce=restricted")
        bundle = base64.b64encode(self.certs.bundle.read_bytes()).decode()
        helm(self.cp, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
             "--set", f"development.webhookURL={self.url}", "--set", f"development.caBundle={bundle}")
        self.login()

    def login(self) -> None:
        """A kubeconfig for the ServiceAccount the manifests or the chart made: the webhook runs with their
        RBAC."""
        token = self.cp.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                                "--duration=24h").stdout.strip()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "webhook",
            "clusters": [{"name": "local", "cluster": {"server": self.api_server,
                                                        "certificate-authority": str(self.cp.ca_file)}}],
            "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": "webhook", "context": {"cluster": "local", "user": SERVICE_ACCOUNT}}],
        }
        certs.write_atomic(self.kubeconfig, yaml.safe_dump(config).encode(), 0o600)

    #: How `serve` starts: this interpreter's package by default; the e2e tier sets the installed wheel's
    #: command.
    command_prefix: tuple[str, ...] = (sys.executable, "-m", "hami_mt_webhook")

    def command(self) -> list[str]:
        return [*self.command_prefix, "serve", "--listen", "127.0.0.1",
                "--port", str(self.port), "--health-listen", self.health_host,
                "--health-port", str(self.health_port),
                "--metrics-port", str(self.metrics_port), "--cert-file", str(self.certs.tls_cert),
                "--key-file", str(self.certs.tls_key), "--kubeconfig", str(self.kubeconfig), *self.extra_args]

    def start(self, timeout: float = 60.0, wait_ready: bool = True) -> None:
        """Start the process and wait until /readyz says the node view is synced (or only /livez)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        # Dies with us, even by SIGKILL, like the control plane's processes: never left retrying its watch.
        self.proc = procs.spawn(self.command(), self.log, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the webhook exited with {self.proc.returncode}:\n{self.tail()}")
            if self.ready() if wait_ready else self.live():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the webhook was not ready after {timeout:.0f} s:\n{self.tail()}")

    def ready(self) -> bool:
        return self._probe("readyz")

    def live(self) -> bool:
        return self._probe("livez")

    def _probe(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.health_host}:{self.health_port}/{path}", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.health_host}:{self.metrics_port}/metrics", timeout=2) as r:
            return r.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Stop the process; returns its exit code (SIGKILL after `timeout`)."""
        return procs.terminate(self.proc, timeout, sig) if self.proc is not None else None

    def tail(self, lines: int = 40) -> str:
        return procs.tail(self.log, lines).rstrip("\n")


#: Signals that end `make run`: Ctrl-C, `kill`, and a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds between the webhook's exit and its restart, doubled after each failed start up to
#: MAX_RESTART_DELAY.
RESTART_DELAY = 10.0
MAX_RESTART_DELAY = 60.0


class Stop(BaseException):
    """Raised by the first stop signal, wherever `try_it` is; later signals are ignored while it cleans up."""


class Console:
    """Prints that survive a closed stdout (`make run | head -1`, a closed `tee`).

    After the first failed write stdout is pointed at /dev/null, so no later print, and not the
    interpreter's final flush, raises BrokenPipeError: the stop must never be skipped for a message.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.closed = False

    def __call__(self, text: str) -> None:
        if self.closed:
            return
        try:
            print(text, file=self.stream, flush=True)
        except (BrokenPipeError, ValueError, OSError):
            self.closed = True
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())
                os.close(devnull)


def _exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


def _run_dir(workdir: Path | None) -> tuple[Path, list[int]]:
    """The run directory's parent, made, and the stop signals set: the first raises `Stop`; once the list
    they return is not empty (the cleanup has begun), later signals change nothing."""
    base = Path(workdir or RUN_DIR)
    base.mkdir(parents=True, exist_ok=True)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if not stopping:
            stopping.append(signum)
            raise Stop(signum)

    for sig in STOP_SIGNALS:  # set explicitly: a shell may start us with SIGINT ignored
        signal.signal(sig, on_signal)
    return base, stopping


def try_it(workdir: Path | None = None, restart_delay: float = RESTART_DELAY, say: Console | None = None,
           installer: str = "kustomize", prometheus: bool = False) -> int:
    """`make run`: control plane, webhook and example nodes until Ctrl-C, SIGTERM or SIGHUP.

    A webhook that dies is reported (how it ended, its last log lines) and restarted after
    `restart_delay` seconds, while the control plane stays up: meanwhile slice pods are refused, the
    outage docs/operating.md describes. Whatever ends the run, the webhook and the control plane are
    stopped and the run directory is removed. With `prometheus`, a Prometheus on loopback scrapes the webhook
    and kube-apiserver with the shipped alerts loaded (manifests/components/monitoring).
    """
    base, stopping = _run_dir(workdir)
    say = say or Console()
    cp = ControlPlane(workdir=base, controllers=True)
    webhook: LocalWebhook | None = None
    prom: monitoring.Prometheus | None = None
    try:
        say("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the first run builds "
            "them) ...")
        cp.start()
        webhook = LocalWebhook(cp, cp.workdir)
        if installer == "helm":
            webhook.install_chart()
        else:
            webhook.install()
        apply_nodes(cp, example_nodes())
        webhook.start()
        if prometheus:
            prom = start_prometheus(cp, webhook)
        say(_banner(cp, webhook, restart_delay, installer, prom))
        return _supervise(cp, webhook, restart_delay, say)
    except Stop:
        return 0
    finally:
        stopping.append(0)  # from here on a signal changes nothing: the cleanup below must finish
        say("\nstopping ...")
        if prom is not None:
            prom.stop()
        if webhook is not None:
            webhook.stop()
        cp.stop()
        say(f"stopped: the webhook, kube-scheduler, kube-controller-manager, kube-apiserver and etcd have "
            f"exited, and {cp.workdir} is removed")


def try_on_node(workdir: Path | None = None, say: Console | None = None, nodes: int = 1) -> int:
    """`make run NODE=1` (`NODES=3`): the chart on real nodes (`devtools.clusters.nodes.NodeCluster`), until
    Ctrl-C, SIGTERM or SIGHUP.

    The webhook runs as the chart's replicas on the nodes' kubelets, as a cluster runs it, so there is no
    local process to restart: a replica that dies is the Deployment's to replace. Whatever ends the run,
    `NodeCluster.stop()` leaves nothing. Returns 1 if a node or the control plane fails.
    """
    base, stopping = _run_dir(workdir)
    say = say or Console()
    cluster = NodeCluster(nodes, workdir=base)
    what = "a node" if nodes == 1 else f"{nodes} nodes"
    try:
        say(f"starting {what}: etcd, kube-apiserver and the controllers in a network namespace of their own, "
            f"containerd and kubelet in one per node, the image imported (the first run builds them) ...")
        cluster.start()
        installed = install_chart_on_node(cluster)
        say(_node_banner(cluster, installed))
        while not (down := _node_down(cluster)):
            time.sleep(0.5)
        say(f"\n{down}; the logs are in {cluster.workdir}, which is removed now")
        return 1
    except Stop:
        return 0
    except (ControlPlaneError, RuntimeError) as err:
        say(f"\nthe nodes did not start: {err}")
        return 1
    finally:
        stopping.append(0)  # from here on a signal changes nothing: the cleanup below must finish
        say("\nstopping ...")
        cluster.stop()
        say(f"stopped: the pods, kubelet, containerd and the control plane have exited, and {cluster.workdir} "
            "is removed")


def _node_down(cluster: NodeCluster) -> str:
    """What of the nodes has exited, or "" while all of it runs."""
    if exited := cluster.controlplane.exited():
        return f"{', '.join(exited)} exited"
    for host in cluster.hosts:
        for name, proc in (("kubelet", host.kubelet), ("containerd", host.containerd)):
            if proc is not None and proc.poll() is not None:
                return f"{name} of {host.name} exited ({_exit_status(proc.returncode)})"
    return ""


def _node_banner(cluster: NodeCluster, installed: float) -> str:
    cp = cluster.controlplane
    where = (f"node {cluster.names[0]} (kubelet and containerd)" if cluster.size == 1 else
             f"nodes {cluster.names[0]} to {cluster.names[-1]}\n(each its own kubelet, containerd and zone)")
    return f"""
hami-mt-webhook runs as the chart's {REPLICAS} replicas on {where}, as a
cluster runs it: release {RELEASE} in namespace {NAMESPACE}, image {NODE_IMAGE_REPOSITORY}, Ready
{installed:.1f} s after helm install (nodes ready in {cluster.startup_seconds:.1f} s; logs in {cluster.workdir}).

  export KUBECONFIG={cp.kubeconfig}
  alias kubectl={cp.bin_dir / 'kubectl'}
  alias helm={cp.bin_dir / 'helm'}
  kubectl -n {NAMESPACE} get pods -o wide; helm -n {NAMESPACE} list
  kubectl get nodes -o wide -L topology.kubernetes.io/zone
  kubectl get nodes -o 'custom-columns={COLUMNS}'
  kubectl apply -f examples/exclusive-pod.yaml && kubectl get pod exclusive-pod -o yaml
  kubectl apply --dry-run=server -f examples/mixed-denied-pod.yaml

There is no local process to kill or restart here: `kubectl -n {NAMESPACE} delete pod <replica>` and the
Deployment replaces it while the others answer. The example nodes carry the taint {NO_KUBELET} (no
kubelet runs them), so only pods that ask for their cards go there.
Ctrl-C stops everything."""


def start_prometheus(cp: ControlPlane, webhook: LocalWebhook) -> monitoring.Prometheus:
    """Prometheus on a loopback port, its data in the run directory: the webhook's metrics as the
    ServiceMonitor's job, kube-apiserver's with the admin certificate, the shipped alerts evaluated."""
    rules = cp.workdir / "prometheus-rules.yaml"
    rules.write_text(yaml.safe_dump(monitoring.component_rules(), sort_keys=False))
    configs = monitoring.scrape_configs(f"127.0.0.1:{webhook.metrics_port}", cp.server, cp.workdir)
    return monitoring.Prometheus(cp.workdir / "prometheus", configs, [rules], interval="5s").start()


#: The nodes' slice capacities as `kubectl get nodes -o custom-columns=...` shows them; printed on one line,
#: so that the hint pastes whole (a backslash-newline inside single quotes would reach kubectl).
COLUMNS = ("NAME:.metadata.name,CORE:.status.capacity.mthreads\\.com/sgpu-core,"
           "MEMORY:.status.capacity.mthreads\\.com/sgpu-memory")


def _banner(cp: ControlPlane, webhook: LocalWebhook, restart_delay: float,
            installer: str = "kustomize", prom: monitoring.Prometheus | None = None) -> str:
    kubectl = cp.bin_dir / "kubectl"
    pid = webhook.proc.pid if webhook.proc else "?"
    how = (f"installed with the Helm chart as release {RELEASE} in namespace {NAMESPACE}; its webhooks "
           "call the process above" if installer == "helm" else
           "installed with the kustomize manifests (make run INSTALL=helm installs the Helm chart instead)")
    chart = "" if installer != "helm" else (
        f"  alias helm={cp.bin_dir / 'helm'}\n"
        f"  helm -n {NAMESPACE} list; helm -n {NAMESPACE} upgrade {RELEASE} "
        f"{CHART.relative_to(CHART.parents[1])} --reuse-values --set enforcement=warn\n")
    graphs = "" if prom is None else (
        f"\nPrometheus: {prom.url} (the shipped alerts: {prom.url}/alerts; it scrapes the webhook and "
        f"kube-apiserver every 5 s)\n")
    return f"""
hami-mt-webhook is serving {webhook.url} for the API server at {cp.server}
(control plane ready in {cp.startup_seconds:.1f} s; webhook pid {pid}, log: {webhook.log}),
{how}.

  export KUBECONFIG={cp.kubeconfig}
  alias kubectl={kubectl}
{chart}  kubectl get nodes -o 'custom-columns={COLUMNS}'
  kubectl apply -f examples/exclusive-pod.yaml && kubectl get pod exclusive-pod -o yaml
  kubectl apply --dry-run=server -f examples/mixed-denied-pod.yaml

To try an outage, `kill {pid}`: the control plane stays up, slice pods are refused, whole-card and other
pods are not, and the webhook is restarted {restart_delay:.0f} s later.
{graphs}Ctrl-C stops everything."""


def _supervise(cp: ControlPlane, webhook: LocalWebhook, restart_delay: float, say: Console) -> int:
    """Watch the webhook until a stop signal; report each exit and restart it, backing off on failed starts.

    Returns 1 if a control-plane process exits: without it there is nothing left to try.
    """
    delay = restart_delay
    while True:
        if exited := cp.exited():
            say(f"\n{', '.join(exited)} exited (running: {', '.join(cp.pids) or 'none'}); "
                f"the logs are in {cp.workdir}, which is removed now")
            return 1
        proc = webhook.proc
        if proc is not None and proc.poll() is None:
            time.sleep(0.5)
            continue
        code = proc.returncode if proc is not None else None
        tail = "\n".join(f"  | {line}" for line in webhook.tail(10).splitlines())
        say(f"\nthe webhook exited ({_exit_status(code) if code is not None else 'not running'}); "
            f"the end of {webhook.log}:\n{tail}\n"
            f"The control plane stays up. Until the webhook is back, pods asking for slices are refused "
            f"(failurePolicy Fail); other pods are admitted. Restarting it in {delay:.0f} s ...")
        time.sleep(delay)
        try:
            webhook.start()
        except RuntimeError as err:
            delay = min(delay * 2, MAX_RESTART_DELAY)
            say(f"the webhook did not start again: {err}")
            continue
        delay = restart_delay
        say(f"the webhook is serving again (pid {webhook.proc.pid if webhook.proc else '?'})")


def main(argv: list[str] | None = None) -> int:
    """`make run`: `python -m devtools.clusters.local [--dir DIR] [--restart-delay SECONDS]`."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.clusters.local",
        description="Start a local etcd + kube-apiserver, the webhook and the example nodes; restart the "
                    "webhook when it exits; stop everything on SIGINT, SIGTERM or SIGHUP.")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the run directory is made (and removed at the end) "
                             "[~/.cache/hami-mt-webhook/run]")
    parser.add_argument("--restart-delay", type=float, default=RESTART_DELAY,
                        help=f"seconds between the webhook's exit and its restart [{RESTART_DELAY:g}]")
    parser.add_argument("--install", choices=["kustomize", "helm"], default="kustomize",
                        help="how the webhook's objects are installed: the kustomize manifests, or the Helm "
                             "chart [kustomize]")
    parser.add_argument("--prometheus", action="store_true",
                        help="also start Prometheus (Debian's package) on loopback with the shipped alerts, "
                             "scraping the webhook and kube-apiserver")
    parser.add_argument("--node", action="store_true",
                        help="run the chart on a real node instead (kubelet, containerd, the built image; "
                             "root): its replicas are the webhook")
    parser.add_argument("--nodes", type=int, default=0,
                        help="the same on this many real nodes, each in a namespace and zone of its own")
    args = parser.parse_args(argv)
    if args.node or args.nodes:
        return try_on_node(args.dir, nodes=max(1, args.nodes))
    return try_it(args.dir, args.restart_delay, installer=args.install, prometheus=args.prometheus)


if __name__ == "__main__":
    sys.exit(main())
