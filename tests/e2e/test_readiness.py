"""A replica is ready once it has read the complete node set; until then slice pods get a retryable denial.

Ready does not need sliced nodes: an empty set, read completely, is an answer (the memoryPerCard
fallback). What keeps a replica unready is not having read the set at all, here because the
ClusterRoleBinding that lets it list Nodes is not there yet.
"""

from __future__ import annotations

import json
import time

from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import apply_nodes, example_nodes
from devtools.clusters.local import LocalWebhook

from .support import MEMORY, ON_S5000, VGPU, apply, pod, until_seen


def _fill(cp: ControlPlane, ns: str, name: str, **spec) -> str:
    r = apply(cp, ns, pod(name, {VGPU: 1}, **spec), "--dry-run=server", "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["spec"]["containers"][0]["resources"]["limits"][MEMORY]


def test_not_ready_until_the_node_set_is_read_and_live_throughout(tmp_path):
    with ControlPlane() as cp:
        hook = LocalWebhook(cp, tmp_path)
        hook.install()
        cp.kubectl("delete", "clusterrolebinding", "hami-mt-webhook")  # it cannot list Nodes yet
        hook.start(wait_ready=False)
        try:
            time.sleep(2)
            assert hook.live() and not hook.ready()
            cp.kubectl("create", "namespace", "early")
            r = apply(cp, "early", pod("too-early", {VGPU: 1}))
            assert r.returncode != 0
            assert "has not yet read the nodes' sGPU capacities; retry in a few seconds" in r.stderr
            r = apply(cp, "early", pod("plain", {"cpu": "10m"}))
            assert r.returncode == 0, r.stderr  # never sent: matchConditions

            hook.install()  # the binding is back
            until_seen("the replica ready, the binding back", hook.ready, timeout=15, interval=0.2,
                       show=lambda _: hook.tail())
            # No node reports sliced cards yet: the complete (empty) set means the configured fallback.
            assert _fill(cp, "early", "no-nodes") == "96"

            apply_nodes(cp, example_nodes())
            until_seen("the S5000's 160 units in the replica's view",
                       lambda: _fill(cp, "early", "on-s5000", nodeSelector=ON_S5000), lambda units: units == "160",
                       15, 0.2)
            r = apply(cp, "early", pod("in-time", {VGPU: 1}))
            assert r.returncode == 0, r.stderr
        finally:
            hook.stop()
