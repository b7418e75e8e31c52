"""What a broken replica costs: slice pods created at 20 a second while one replica or its node fails.

kube-apiserver calls a webhook once and never retries, so every call it sends to a replica that cannot
answer is a refused pod creation. Each fault here is done to one replica of a `nodes.NodeCluster` (one replica
per node, the chart installed), the one the API server's connections go to (`Faults.busiest`), while
`traffic.creating` sends slice pods, and every creation's outcome is kept: how many were refused, over how
long a window, and when the API server's view of the endpoint changed (the EndpointSlice, polled every
0.2 s). The fault tier holds the figures to targets (`tests/faults`); `python -m devtools.scenarios.faults` measures
every fault with failover off and then on, on one cluster in one run, and prints the table
docs/PERFORMANCE.md keeps.

    python -m devtools.scenarios.faults [--version newest|floor|1.MINOR] [--faults crash,hang,...] [--only on|off]
        [--long SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from devtools import paths
from devtools.clusters import helm_release
from devtools.clusters.controlplane import KubectlError
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread, Outcome, creating
from devtools.waiting import NotWithin, until
from hami_mt_webhook.service.failover.peerview import CONDITION

__all__ = ["FAULTS", "GRAY", "Count", "EndpointWatch", "Fault", "Faults", "gray", "main"]

RATE = 20  # slice pods per second
#: Seconds of traffic before the fault, so the figures start from a steady state.
LEAD = 3.0
NAMESPACE = helm_release.NAMESPACE
SERVICE = helm_release.RELEASE


@dataclass
class Count:
    """One fault's figures: creations sent and refused, and when (seconds from the fault)."""

    fault: str
    sent: int
    refused: int
    #: Seconds from the first refused creation to the last (0 for one, None for none).
    window: float | None
    #: Seconds from the fault to the victim's endpoint not ready in the EndpointSlice (None: it never left).
    left_endpoints: float | None
    #: How the refusals read, counted: the API server's error, shortened.
    errors: Counter[str] = field(default_factory=Counter)
    #: Times the victim left the endpoints after the fault: more than once is a replica going in and out.
    exits: int = 0
    #: The other replicas' addresses seen not ready after the fault: healthy replicas taken out.
    others_out: frozenset[str] = frozenset()
    #: Halfway through a gray fault: the victim's readiness-gate message, and each other replica's
    #: `hami_mt_webhook_peer_failure_ratio` of it (what an operator would read then).
    midway: str = ""
    ratios: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        window = "" if self.window is None else f" over {self.window:.1f} s"
        left = "never" if self.left_endpoints is None else f"{self.left_endpoints:.1f} s"
        kinds = "; ".join(f"{n}x {k}" for k, n in self.errors.most_common(2))
        exits = f", out {self.exits} times" if self.exits > 1 else ""
        others = f"; others out: {', '.join(sorted(self.others_out))}" if self.others_out else ""
        midway = ""
        if self.midway or self.ratios:
            ratios = ", ".join(f"{100 * r:.0f} %" for _, r in sorted(self.ratios.items()))
            midway = f"; halfway: {self.midway or 'no verdict'!r}, others' failure ratio {ratios or '-'}"
        return (f"{self.fault}: {self.refused} of {self.sent} refused{window}; endpoint not ready after {left}"
                f"{exits}{others}" + (f" ({kinds})" if kinds else "") + midway)


def count(fault: str, outcomes: list[Outcome], at: float, endpoints: EndpointWatch, victim: str) -> Count:
    """The figures of `fault`, done at `at` to the replica whose address is `victim`."""
    refused = sorted((o for o in outcomes if o.status != 201), key=lambda o: o.sent)
    window = refused[-1].sent - refused[0].sent if refused else None
    errors: Counter[str] = Counter(_kind(o) for o in refused)
    left = endpoints.left(victim, at)
    return Count(fault, len(outcomes), len(refused), window, None if left is None else left - at, errors,
                 endpoints.exits(victim, at), endpoints.others_out(victim, at))


def _kind(o: Outcome) -> str:
    for words in ("context deadline exceeded", "connection refused", "no route to host", "i/o timeout",
                  "connection reset", "no endpoints available", "EOF"):
        if words in o.detail:
            return words
    return f"HTTP {o.status}" if o.status else o.detail[:60]


class EndpointWatch:
    """The Service's EndpointSlices polled every 0.2 s: when each address was last seen ready."""

    # The thread, stop event and __enter__/__exit__ frame is tests/e2e/test_nodeview.py's Prober's: the same
    # idiom, not shared logic; each polls something else, and a base class for four lines would hide more than
    # it saves.

    def __init__(self, cluster: NodeCluster) -> None:
        self.cluster = cluster
        self.changes: list[tuple[float, dict[str, bool]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="endpoint watch")

    def __enter__(self) -> EndpointWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, KubectlError, ValueError, KeyError):
                slices = self.cluster.controlplane.get(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/"
                                                       "endpointslices",
                                                       labelSelector=f"kubernetes.io/service-name={SERVICE}")
                ready = {e["addresses"][0]: bool(e.get("conditions", {}).get("ready"))
                         for s in slices["items"] for e in s.get("endpoints") or []}
                if not self.changes or self.changes[-1][1] != ready:
                    self.changes.append((time.time(), ready))
            self._stop.wait(0.2)

    def left(self, ip: str, after: float) -> float | None:
        """When `ip` was first seen not ready (or gone) after `after`."""
        return next((t for t, ready in self.changes if t >= after and not ready.get(ip, False)), None)

    def exits(self, ip: str, after: float) -> int:
        """How many times `ip` went from ready to not ready (or gone) after `after`."""
        was, n = self._before(after).get(ip, False), 0
        for t, ready in self.changes:
            if t >= after:
                n += was and not ready.get(ip, False)
                was = ready.get(ip, False)
        return n

    def others_out(self, ip: str, after: float) -> frozenset[str]:
        """The addresses but `ip` that were ready before `after` and seen not ready (or gone) since."""
        others = {a for a, r in self._before(after).items() if r and a != ip}
        return frozenset(a for t, ready in self.changes if t >= after for a in others if not ready.get(a, False))

    def _before(self, at: float) -> dict[str, bool]:
        return next((ready for t, ready in reversed(self.changes) if t < at), {})


@dataclass(frozen=True)
class Fault:
    """A fault done to the replica `victim` (a pod) on `node`: `act` runs once traffic is steady and returns
    when the fault is over (or has been done, for one that heals by itself); `seconds` of traffic in all."""

    name: str
    seconds: float
    act: Callable[[NodeCluster, str, str], object]


def _freeze(cluster: NodeCluster, pod: str, _node: str) -> None:
    cluster.freeze_pod(NAMESPACE, pod)
    time.sleep(20)
    cluster.thaw_pod(NAMESPACE, pod)


def _revive_later(cluster: NodeCluster, _pod: str, node: str) -> None:
    cluster.revive_node(node)


#: How long each gray fault lasts: the issue's 60 s (`make faults` runs them for 180 s too: the cost of one that
#: is caught must not grow with its length).
GRAY_SECONDS = 60.0
#: Traffic after a gray fault heals, so the figures include the replica's return to the endpoints.
GRAY_AFTER = 10.0

Act = Callable[[NodeCluster, str, str], None]


def _lossy(percent: int, seconds: float) -> Act:
    def act(cluster: NodeCluster, pod: str, _node: str) -> None:
        cluster.lose_pod(NAMESPACE, pod, percent)
        try:
            time.sleep(seconds)
        finally:
            cluster.heal_pod(NAMESPACE, pod)
    return act


def _slow(delay: float, seconds: float) -> Act:
    """The pod's answers on each of its container ports (webhook, probe, metrics) held `delay` seconds."""
    def act(cluster: NodeCluster, pod: str, _node: str) -> None:
        ports = [p["containerPort"] for c in cluster.pod(NAMESPACE, pod)["spec"]["containers"]
                 for p in c.get("ports") or ()]
        cluster.delay_pod(NAMESPACE, pod, delay, ports)
        try:
            time.sleep(seconds)
        finally:
            cluster.heal_pod(NAMESPACE, pod)
    return act


def _flapping(seconds: float) -> Act:
    return lambda c, p, _n: c.flap_pod(NAMESPACE, p, seconds)


#: The gray faults (the replica still answers, but badly): each one's name and its act for a given length.
GRAY: dict[str, tuple[str, Callable[[float], Act]]] = {
    "loss10": ("10 % packet loss", partial(_lossy, 10)),
    "loss30": ("30 % packet loss", partial(_lossy, 30)),
    "loss60": ("60 % packet loss", partial(_lossy, 60)),
    "flap": ("link flapping (down 1 s, up 2 s)", _flapping),
    "slow500": ("answers 500 ms late", partial(_slow, 0.5)),
    "slow2500": ("answers 2.5 s late", partial(_slow, 2.5)),
}


def gray(key: str, seconds: float = GRAY_SECONDS) -> Fault:
    """The gray fault `key` lasting `seconds`."""
    name, act = GRAY[key]
    return Fault(f"{name} {seconds:g} s", seconds + GRAY_AFTER, act(seconds))


#: Each fault as the issues list them; `node back` follows `node killed`.
FAULTS = {
    "crash": Fault("crash (SIGKILL)", 20, lambda c, p, _n: c.kill_pod(NAMESPACE, p)),
    "oom": Fault("OOM kill under the memory limit", 25, lambda c, p, _n: c.oom_kill_pod(NAMESPACE, p) and None),
    "hang": Fault("hang (SIGSTOP 20 s)", 30, _freeze),
    "cut": Fault("network cut 30 s", 40, lambda c, p, _n: c.cut_pod(NAMESPACE, p, seconds=30)),
    "kubelet": Fault("kubelet restarted", 20, lambda c, _p, n: c.restart_kubelet(n)),
    "containerd": Fault("containerd restarted", 20, lambda c, _p, n: c.restart_containerd(n)),
    **{key: gray(key) for key in GRAY},
    # long enough for the node controller to act without failover (its grace period is 40 s on 1.30, 50 s from 1.32)
    "node": Fault("node killed", 60, lambda c, _p, n: c.kill_node(n)),
    "back": Fault("node back", 40, _revive_later),
}


class Faults:
    """The chart on a cluster of 3 nodes, one replica each, and the faults measured on it."""

    def __init__(self, cluster: NodeCluster, lt: LoopThread) -> None:
        self.cluster, self.lt = cluster, lt
        self._runs = 0
        #: The node `node killed` killed last: the one `node back` revives.
        self.killed = ""

    def replicas(self) -> list[dict[str, Any]]:
        return helm_release.replicas(self.cluster)

    def victim(self, node: str) -> dict[str, Any]:
        (pod,) = [p for p in self.replicas() if p["spec"].get("nodeName") == node]
        return pod

    def settled(self, timeout: float = 180.0) -> None:
        """Every replica Ready (its gate True where it has one) and the EndpointSlice saying so: the state each
        fault starts from."""
        ready: list[str] = []

        def all_ready() -> bool:
            pods = self.replicas()
            ready[:] = [p["metadata"]["name"] for p in pods
                        if all(c["status"] == "True" for c in p["status"].get("conditions", [])
                               if c["type"] in ("Ready", CONDITION))
                        and any(c["type"] == "Ready" for c in p["status"].get("conditions", []))]
            return len(ready) == helm_release.REPLICAS == len(pods)

        until("the replicas settled", all_ready, timeout, 0.5, fail=lambda m: NotWithin(f"{m}: {ready} Ready"))

    def busiest(self) -> dict[str, Any]:
        """The replica holding most of kube-apiserver's connections now. On 1.37 every call picks a ready
        endpoint at random, so any replica takes a third of them; on 1.30 an endpoint is picked only when a
        connection is dialled and kept-alive connections stay pinned to it, so one replica may take them all
        and a fault elsewhere would cost nothing: the fault goes where the calls go."""
        def connections(pod: dict[str, Any]) -> float:
            found = re.search(r"^hami_mt_webhook_connections (\S+)$", self.scrape(pod), re.M)
            return float(found.group(1)) if found else 0.0
        return max(self.replicas(), key=connections)

    def scrape(self, pod: dict[str, Any]) -> str:
        return helm_release.scrape(self.cluster, pod)

    def observe(self, victim: dict[str, Any], result: Count) -> None:
        """What an operator reads about `victim` now: its gate's message, the others' failure ratio of it."""
        name = victim["metadata"]["name"]
        pods = self.replicas()
        gate: dict[str, Any] = next((c for p in pods if p["metadata"]["name"] == name
                                     for c in p["status"].get("conditions", []) if c["type"] == CONDITION), {})
        result.midway = gate.get("message", "")
        for pod in pods:
            if pod["metadata"]["name"] != name and (found := re.search(
                    rf'^hami_mt_webhook_peer_failure_ratio{{peer="{re.escape(name)}"}} (\S+)$', self.scrape(pod),
                    re.M)):
                result.ratios[pod["metadata"]["name"]] = float(found.group(1))

    def measure(self, key: str, node: str | None = None, seconds: float | None = None) -> Count:
        """`FAULTS[key]` (a gray one lasting `seconds` if given) done under traffic to the replica on `node`, or
        by default to the one the API server's connections go to (`busiest`; `node back` revives the node
        killed last); the replicas settled before and after."""
        fault = gray(key, seconds) if seconds is not None else FAULTS[key]
        if key != "back":
            self.settled()
        self._runs += 1
        with EndpointWatch(self.cluster) as endpoints, \
                creating(self.cluster.controlplane, self.lt, f"faults-{self._runs}-{key}", RATE,
                         fault.seconds) as creator:
            time.sleep(LEAD)
            if node is None:
                node = self.killed if key == "back" else self.busiest()["spec"]["nodeName"]
            victim = self.victim(node)
            at = time.time()
            seen = Count(fault.name, 0, 0, None, None)  # its midway and ratios filled halfway through
            halfway = threading.Timer((fault.seconds - GRAY_AFTER) / 2, self.observe, (victim, seen))
            if key in GRAY:
                halfway.start()
            try:
                fault.act(self.cluster, victim["metadata"]["name"], node)
            finally:
                halfway.cancel()
                if halfway.is_alive():
                    halfway.join()
        if key == "node":
            self.killed = node
        result = count(fault.name, creator.outcomes, at, endpoints, victim["status"].get("podIP", ""))
        result.midway, result.ratios = seen.midway, seen.ratios
        if key != "node":
            self.settled()
        return result

    def deployment(self, name: str, fault: Callable[[], None] | None = None, replicas: int = 100,
                   timeout: float = 300.0) -> float:
        """Seconds from creating a Deployment of `replicas` slice pods (with `fault` done at that moment) to
        all its pods existing: the ReplicaSet controller retries the creations refused meanwhile."""
        ns = f"deploy-{name}"
        self.cluster.kubectl("create", "namespace", ns)
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
                      "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                               "template": {"metadata": {"labels": {"app": name}}, "spec": {
                                   "containers": [{"name": "main", "image": "example.invalid/train",
                                                   "resources": {"limits": {"mthreads.com/vgpu": "1"}}}]}}}}
        started = time.monotonic()
        self.cluster.kubectl("create", "-f", "-", input=json.dumps(deployment))
        if fault is not None:
            fault()
        pods = [0]

        def all_exist() -> bool:
            pods[0] = len(self.cluster.kubectl("get", "pods", "-n", ns, "-o", "name", check=False).stdout.split())
            return pods[0] >= replicas

        try:  # the deadline counts from the Deployment's creation, as the figure does
            until(f"Deployment {ns}/{name}'s pods", all_exist, started + timeout - time.monotonic(), 0.2,
                  fail=lambda _: NotWithin(f"Deployment {ns}/{name}: {pods[0]} of {replicas} pods "
                                           f"after {timeout:.0f} s"))
            return time.monotonic() - started
        finally:
            self.cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@contextlib.contextmanager
def cluster_with_chart(version: str | None, values: tuple[str, ...] = ()) -> Iterator[NodeCluster]:
    """3 nodes (the third labelled as a GPU node, as the vendor's device plugin labels them) and the chart
    installed with `values`, its replicas one per node."""
    cluster = NodeCluster(3, version=version, labels=[{}, {}, {"mthreads.com/gpu-node": "true"}])
    try:
        cluster.start()
        helm_release.install(cluster, values=values)
        yield cluster
    finally:
        cluster.stop()


def table(rows: dict[str, dict[str, Count]]) -> list[str]:
    """Markdown: each fault's refused creations (and window) with failover off and on."""
    modes = [m for m in ("off", "on") if any(m in r for r in rows.values())]
    out = ["| fault | " + " | ".join(f"failover {m}: refused (window; endpoint out after)" for m in modes) + " |",
           "|---|" + "---|" * len(modes)]
    for key, by_mode in rows.items():
        cells = []
        for m in modes:
            c = by_mode.get(m)
            if c is None:
                cells.append("")
                continue
            window = "" if c.window is None else f"{c.window:.1f} s"
            left = "stays" if c.left_endpoints is None else f"{c.left_endpoints:.1f} s"
            exits = f", out {c.exits} times" if c.exits > 1 else ""
            others = f"; others out: {len(c.others_out)}" if c.others_out else ""
            cells.append(f"{c.refused} of {c.sent} ({window or '-'}; {left}{exits}{others})")
        name = next(iter(by_mode.values())).fault if by_mode else key
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.scenarios.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=None, help="Kubernetes version (newest, floor, 1.MINOR)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--only", choices=("on", "off"), help="failover on or off only")
    parser.add_argument("--no-deployment", dest="deployment", action="store_false",
                        help="leave out the Deployment of 100 slice pods created as a node is killed")
    parser.add_argument("--long", type=float, default=180.0, metavar="SECONDS",
                        help="with failover on, each gray fault named again lasting this long (0: not again): "
                             "a fault that is caught costs no more for lasting longer")
    args = parser.parse_args(argv)
    keys = [k for k in args.faults.split(",") if k]
    unknown = [k for k in keys if k not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    if args.long < 0:
        parser.error(f"--long: {args.long:g} is below 0")
    rows: dict[str, dict[str, Count]] = {k: {} for k in keys}
    modes = [args.only] if args.only else ["off", "on"]
    lt = LoopThread()
    try:
        with cluster_with_chart(args.version, (f"failover.enabled={modes[0] == 'on'}".lower(),)) as cluster:
            print(f"Kubernetes {cluster.controlplane.git_version}, 3 nodes, {RATE} slice pods/s", flush=True)
            faults = Faults(cluster, lt)
            for i, mode in enumerate(modes):
                if i:
                    helm_release.helm(cluster.controlplane, "upgrade", helm_release.RELEASE, str(paths.CHART),
                                      "-n", NAMESPACE, "--reuse-values", "--set",
                                      f"failover.enabled={mode == 'on'}".lower(), "--wait")
                for key in keys:
                    result = faults.measure(key)
                    rows[key][mode] = result
                    print(f"failover {mode}: {result.line()}", flush=True)
                    if key == "node" and "back" not in keys:
                        cluster.revive_node(faults.killed)
                for key in [k for k in keys if k in GRAY and args.long and mode == "on"]:
                    result = faults.measure(key, seconds=args.long)
                    rows.setdefault(f"{key}-long", {})[mode] = result
                    print(f"failover {mode}: {result.line()}", flush=True)
                if args.deployment:
                    faults.settled()
                    calm = faults.deployment(f"calm-{mode}")
                    node = cluster.names[-1]
                    try:
                        killed = faults.deployment(f"killed-{mode}", fault=partial(cluster.kill_node, node))
                    finally:
                        cluster.revive_node(node)
                    print(f"failover {mode}: Deployment of 100 slice pods whole {calm:.1f} s after it was "
                          f"created, {killed:.1f} s with a node killed at that moment", flush=True)
        print("\n".join(table(rows)))
    finally:
        lt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
