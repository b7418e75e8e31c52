"""The chart's replicas on the node tier's node, as kubectl sees them: who is there, who is Ready, a rollout
waited out, and failover's view of them. Shared by the tier's chart fixture (the upgrade it starts with) and
its uptime tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from devtools.clusters import helm_release
from devtools.clusters.helm_release import replicas
from devtools.clusters.nodes import NodeCluster
from devtools.scenarios.faults import CONDITION
from devtools.waiting import seconds_until

NAMESPACE = helm_release.NAMESPACE
DEPLOYMENT = f"deployment/{helm_release.RELEASE}"
#: The probe port, where a replica answers `/peers` (failover's view of the others).
PROBE_PORT = 8080


def ready(node: NodeCluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in replicas(node)
                  if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))


def wait_for(what: str, check: Callable[[], bool], timeout: float = 180.0) -> float:
    """`seconds_until`, with the node tier's deadline: a rollout on real nodes takes minutes."""
    return seconds_until(what, check, timeout)


def rolled_out(node: NodeCluster) -> None:
    """The rollout done and the old replicas gone: until their preStop ends they still answer on the
    API server's kept-alive connections, with the old settings."""
    node.kubectl("rollout", "status", DEPLOYMENT, "-n", NAMESPACE, "--timeout=180s", timeout=200)
    wait_for("3 replicas Ready, no other left",
             lambda: len(ready(node)) == 3 and len(replicas(node, terminating=True)) == 3)


def failover(node: NodeCluster) -> dict[str, Any]:
    """Each replica's failover state: its readiness gate declared and True, and the peers its `/peers` says it
    hears and holds silent (`{name: {"gate": bool, "heard": [...], "silent": [...]}}`)."""
    state = {}
    for p in replicas(node):
        name = p["metadata"]["name"]
        gates = [g["conditionType"] for g in p["spec"].get("readinessGates") or []]
        true = any(c["type"] == CONDITION and c["status"] == "True" for c in p["status"].get("conditions", []))
        raw = node.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}:{PROBE_PORT}/proxy/peers",
                           check=False).stdout
        view = json.loads(raw) if raw.startswith("{") else {}
        state[name] = {"gate": gates == [CONDITION] and true, "heard": sorted(view.get("heard") or {}),
                       "silent": sorted(view.get("silent") or [])}
    return state


def failover_working(node: NodeCluster) -> bool:
    """Every replica gated, hearing every other one and holding none silent."""
    state = failover(node)
    return len(state) == helm_release.REPLICAS and all(
        s["gate"] and set(s["heard"]) >= set(state) - {name} and not s["silent"] for name, s in state.items())
