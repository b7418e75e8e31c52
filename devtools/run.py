"""`make run`: the webhook beside a local control plane (or the chart on real nodes, `NODE=1`), supervised
until Ctrl-C, SIGTERM or SIGHUP, with a banner that says how to use it."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from devtools.builds.binaries import ControlPlaneError
from devtools.clusters import monitoring
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import (
    NAMESPACE,
    NO_KUBELET,
    NODE_IMAGE_REPOSITORY,
    RELEASE,
    REPLICAS,
    apply_nodes,
    example_nodes,
    install,
)
from devtools.clusters.local import LocalWebhook
from devtools.clusters.nodes import NodeCluster
from devtools.paths import CHART, RUN_DIR

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
        installed = install(cluster)
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
    """`make run`: `python -m devtools.run [--dir DIR] [--restart-delay SECONDS]`."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.run",
        description="Start a local etcd + kube-apiserver, the webhook and the example nodes; restart the "
                    "webhook when it exits; stop everything on SIGINT, SIGTERM or SIGHUP.")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the run directory is made (and removed at the end) "
                             "[~/.cache/hami-mt-webhook/run]")
    parser.add_argument("--restart-delay", type=float, default=RESTART_DELAY,
                        help=f"seconds between the webhook's exit and its restart [{RESTART_DELAY:g}]")
    # Alike in shape only with the bench's and the CLI's flags (argparse's form): other options, nothing to share.
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
