"""A replica is ready only once its node index is synced; until then slice pods get a retryable denial."""

from __future__ import annotations

import time

from hami_mt_webhook.controlplane import ControlPlane
from hami_mt_webhook.local import LocalWebhook, apply_nodes, example_nodes

from .support import VGPU, apply, pod


def test_not_ready_until_nodes_are_indexed_and_live_throughout(tmp_path):
    # A cluster with no nodes yet: the index cannot be synced, so the replica must not claim readiness.
    with ControlPlane() as cp:
        hook = LocalWebhook(cp, tmp_path)
        hook.install()
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

            apply_nodes(cp, example_nodes())
            deadline = time.monotonic() + 15
            while not hook.ready() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert hook.ready(), hook.tail()
            assert "hami_mt_webhook_sliced_nodes 2.0" in hook.metrics()
            r = apply(cp, "early", pod("in-time", {VGPU: 1}))
            assert r.returncode == 0, r.stderr
        finally:
            hook.stop()
