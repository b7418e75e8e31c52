"""Locked down, on the fault tier's three nodes while slice pods are created at 20 a second (issue 45):

- a flood of 19,000 connections from one pod on another node, to every port of the replica kube-apiserver's
  calls go to, refuses no pod, leaves that replica's memory under the chart's limit and the other replicas in
  service throughout, and that replica back in service once the flood ends. The flooded replica is
  CPU-starved: answering its peers' probes or kubelet's late enough to be taken out is then the right verdict
  on it (a gray failure, issue 47), not a fault of the test, so it is counted, not forbidden;
- the chart's NetworkPolicies, enforced by kube-network-policies on every node (`devtools.clusters.netpol`), let
  kube-apiserver's calls, kubelet's probes, the replicas' probes of each other and a scrape from the
  monitoring namespace through, through an install, a rollout and a crash with none refused, and nothing
  else: a pod in another namespace reaches no port of a replica; failover still takes a hung replica out.

This module runs after test_faults.py on the same cluster (modules run in name order), with its nodes back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools import paths
from devtools.clusters import helm_release
from devtools.clusters.host import FABRIC_IP
from devtools.clusters.netpol import Enforcer
from devtools.clusters.nodes import NodeCluster
from devtools.load import attacks
from devtools.load.traffic import LoopThread, Outcome, creating
from devtools.scenarios.faults import RATE, EndpointWatch, Faults
from hami_mt_webhook.service.failover.peerview import CONDITION
from tests.node.pods import connect, in_pod, pause_pod

from .conftest import MEASURED

NS = helm_release.NAMESPACE
#: One pod's flood: (kind, port, connections), 19,000 in all: the probe port's request line and then a header
#: byte every 10 s (the measured attack), kept-alive idle connections on the metrics port, and TCP connections
#: that never start a TLS handshake on the webhook port.
FLOODS = (("slow-header", 8080, 10_000), ("plain-idle", 9090, 4_000), ("silent", 8443, 5_000))
PORTS = (8443, 8080, 9090)
#: The values that turn the policies on: kube-apiserver calls the nodes' pods from the fabric's address.
POLICY = ("networkPolicy.enabled=true", f"networkPolicy.apiServer.cidrs={{{FABRIC_IP}/32}}")
#: What Python prints for a GET of a replica's /metrics from inside a pod: the status, or the error.
SCRAPE = """
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}:9090/metrics", timeout=3) as r:
        print(r.status, b"\\nhami_mt_webhook_ready " in r.read())
except OSError as e:
    print("error", e)
"""


def run(prefix: list[str], script: str, *args: str) -> str:
    """What a Python `script` prints, run where `prefix` enters (a pod's network namespace)."""
    done = subprocess.run([*prefix, sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def memory_limit() -> int:
    """The chart's memory limit for a replica, in bytes."""
    text = yaml.safe_load((paths.CHART / "values.yaml").read_text())["resources"]["limits"]["memory"]
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()  # type: ignore[union-attr]
    return int(number) << (20 if unit == "Mi" else 30)


def refused(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status != 201]


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def conditions(faults: Faults, kind: str) -> dict[str, dict[str, str]]:
    """Each replica's condition `kind` (`{}` where it has none)."""
    return {pod["metadata"]["name"]: next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), {})
            for pod in faults.replicas()}


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


def test_a_flood_from_one_pod_to_every_port_leaves_a_replica_serving(
        cluster: NodeCluster, faults: Faults, lt: LoopThread, tmp_path: Path) -> None:
    faults.settled()
    victim = faults.busiest()
    name, ip, node = victim["metadata"]["name"], victim["status"]["podIP"], victim["spec"]["nodeName"]
    restarts = victim["status"]["containerStatuses"][0]["restartCount"]
    cluster.kubectl("create", "namespace", "lockdown-flood")
    attacker = pause_pod(cluster, "attacker", next(n for n in cluster.names if n != node), "lockdown-flood")
    with creating(cluster.controlplane, lt, "lockdown-calm", RATE, 15) as calm:
        pass
    before = cluster.pod_memory(NS)[name]
    prefix = in_pod(cluster, "lockdown-flood", attacker)
    flooders = [attacks.Flooder(kind, count, port, tmp_path / f"{kind}.log", prefix=prefix, host=ip)
                for kind, port, count in FLOODS]
    peak, unready, verdicts = before, set[str](), set[tuple[str, str]]()
    try:
        assert all(f.wait_holding(180) for f in flooders), [f.proc.poll() for f in flooders]
        held = cluster.pod_memory(NS)[name]
        at = time.time()
        with EndpointWatch(cluster) as endpoints, \
                creating(cluster.controlplane, lt, "lockdown-flood-traffic", RATE, 30) as creator:
            for _ in range(30):
                peak = max(peak, cluster.pod_memory(NS).get(name, 0))
                unready |= {n for n, c in conditions(faults, "Ready").items() if c.get("status") != "True"}
                verdicts |= {(n, c.get("message", "")) for n, c in conditions(faults, CONDITION).items()
                             if c.get("status") == "False"}
                time.sleep(1)
    finally:
        stats = [f.stop() for f in flooders]
        cluster.kubectl("delete", "namespace", "lockdown-flood", "--wait=false", check=False)
    time.sleep(15)
    after = cluster.pod_memory(NS)[name]
    took = [o.took for o in creator.outcomes if o.status == 201]
    calm_took = [o.took for o in calm.outcomes if o.status == 201]
    opened = sum(s.get("opened", 0) for s in stats)
    MEASURED.append(
        f"19,000 connections from one pod ({opened} opened, reopened as shed) to {name}'s three ports: "
        f"{len(creator.outcomes) - len(refused(creator.outcomes))}/{len(creator.outcomes)} slice pods created; "
        f"creation p50/p99 {p(took, 0.5) * 1000:.0f}/{p(took, 0.99) * 1000:.0f} ms (calm "
        f"{p(calm_took, 0.5) * 1000:.0f}/{p(calm_took, 0.99) * 1000:.0f}); working set {before / 2**20:.0f} MiB "
        f"before, {held / 2**20:.0f} held, peak {peak / 2**20:.0f}, {after / 2**20:.0f} after; taken out by "
        f"failover {endpoints.exits(ip, at)} time(s){''.join(sorted({f' ({m})' for _, m in verdicts}))}, "
        f"Ready False at some point (kubelet's probe or failover's gate): {'yes' if name in unready else 'no'}")
    # What the flood may not do, whatever the machine's luck: refuse a pod, grow the replica without bound, or
    # take out a replica it does not reach.
    assert not refused(calm.outcomes) and not refused(creator.outcomes), refused(creator.outcomes)[:3]
    assert peak < memory_limit() * 0.75, peak
    assert unready <= {name}, unready  # every other replica stayed Ready (kubelet's probes, failover's gate)
    assert {n for n, _ in verdicts} <= {name}, verdicts  # failover judged none of the others
    assert not endpoints.others_out(ip, at), endpoints.changes
    # What it may do: take the starved replica out, kubelet or failover (whose verdict names its majority) ...
    assert all(re.search(r"[23] of 3 replicas agree", message) for _, message in verdicts), verdicts
    faults.settled(60)  # ... as long as it is back, Ready with its gate True, once it answers cleanly again
    victim_now = cluster.pod(NS, name)
    assert victim_now["status"]["containerStatuses"][0]["restartCount"] == restarts


@pytest.fixture(scope="module")
def enforced(cluster: NodeCluster, faults: Faults) -> Iterator[Enforcer]:
    """kube-network-policies on every node; on leaving, the policies off and it stopped (the table removed)."""
    faults.settled()
    enforcer = Enforcer(cluster).start()
    try:
        yield enforcer
    finally:
        helm_release.helm(cluster.controlplane, "upgrade", helm_release.RELEASE, str(paths.CHART), "-n", NS,
                          "--reuse-values",
                   "--set", "networkPolicy.enabled=false")
        enforcer.stop()


def test_the_policies_go_in_and_replicas_roll_and_crash_with_no_pod_refused(
        cluster: NodeCluster, faults: Faults, enforced: Enforcer, lt: LoopThread) -> None:
    cp = cluster.controlplane
    with creating(cp, lt, "lockdown-install", RATE, 25) as installing:
        time.sleep(3)
        helm_release.helm(cp, "upgrade", helm_release.RELEASE, str(paths.CHART), "-n", NS, "--reuse-values",
                   *(a for v in POLICY for a in ("--set", v)))
    policies = json.loads(cluster.kubectl("get", "networkpolicies", "-n", NS, "-o", "json").stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "hami-mt-webhook-admission", "hami-mt-webhook-observability", "hami-mt-webhook-peers"]
    faults.settled()
    with creating(cp, lt, "lockdown-rollout", RATE, 60) as rolling:
        time.sleep(3)
        cluster.kubectl("rollout", "restart", "deployment", helm_release.RELEASE, "-n", NS)
        cluster.kubectl("rollout", "status", "deployment", helm_release.RELEASE, "-n", NS, "--timeout=55s", timeout=60)
    faults.settled()  # the new pods Ready: kubelet's probes and the replicas' probes of each other got through
    crash = faults.measure("crash")
    enforced.check()
    MEASURED.append(f"NetworkPolicies enforced: slice pods refused through their install "
                    f"{len(refused(installing.outcomes))} of {len(installing.outcomes)}, a rollout "
                    f"{len(refused(rolling.outcomes))} of {len(rolling.outcomes)}; {crash.line()}")
    assert not refused(installing.outcomes), refused(installing.outcomes)[:3]
    assert not refused(rolling.outcomes), refused(rolling.outcomes)[:3]
    assert crash.refused <= 2, crash.line()  # as without the policies (test_faults.MOST_REFUSED)


def test_only_each_ports_caller_reaches_it(cluster: NodeCluster, faults: Faults, enforced: Enforcer) -> None:
    faults.settled()
    replicas = {r["spec"]["nodeName"]: r["status"]["podIP"] for r in faults.replicas()}
    assert cluster.fabric is not None
    fabric = cluster.fabric.prefix
    for namespace in ("lockdown-stranger", "monitoring"):
        cluster.kubectl("create", "namespace", namespace)
    try:
        n1, n2, _ = cluster.names
        stranger = in_pod(cluster, "lockdown-stranger", pause_pod(cluster, "stranger", n1, "lockdown-stranger"))
        scraper = in_pod(cluster, "monitoring", pause_pod(cluster, "prometheus", n2, "monitoring"))
        seen = {(who, node, port): connect(prefix, ip, port)
                for who, prefix in (("stranger", stranger), ("monitoring", scraper))
                for node, ip in replicas.items() for port in PORTS}
        # a pod of another namespace: no port of any replica, on its own node or across
        assert {k: v for k, v in seen.items() if k[0] == "stranger" and v != "timeout"} == {}
        # the monitoring namespace: the metrics port, and nothing else
        assert {k: v for k, v in seen.items() if k[0] == "monitoring" and (v == "connected") != (k[2] == 9090)} == {}
        for ip in replicas.values():
            assert run(scraper, SCRAPE, ip) == "200 True"
            # kube-apiserver's address: the webhook port (its calls), not the others
            assert connect(fabric, ip, 8443) == "connected"
            assert connect(fabric, ip, 9090) == "timeout"
    finally:
        for namespace in ("lockdown-stranger", "monitoring"):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert all(c.get("status") == "True" for kind in ("Ready", CONDITION)  # kubelet's probes and the
               for c in conditions(faults, kind).values())  # replicas' probes of each other pass
    MEASURED.append(f"NetworkPolicies enforced: a pod of another namespace reached none of {len(replicas) * 3} "
                    "ports of the replicas; the monitoring namespace scraped each replica's metrics port only; "
                    "kube-apiserver's address the webhook port only")


def test_failover_takes_a_hung_replica_out_behind_the_policies(faults: Faults, enforced: Enforcer) -> None:
    hang = faults.measure("hang")
    enforced.check()
    MEASURED.append(f"NetworkPolicies enforced: {hang.line()}")
    assert hang.left_endpoints is not None and hang.left_endpoints <= 3.0, hang.line()
    assert hang.refused <= 15, hang.line()


