"""A hostile tenant floods the webhook's port; kube-apiserver's calls must still get through."""

from __future__ import annotations

import asyncio
import time

from devtools.load.attacks import Flood
from devtools.load.traffic import LoopThread

from .support import CORE, MEMORY, VGPU, apply, metric, namespace, pod, resources, stored, until_seen

ns = namespace("e2e-hostile")


def test_a_slice_pod_is_admitted_while_idle_connections_and_handshakes_flood_the_port(controlplane, webhook, ns):
    admitted_under(controlplane, webhook, ns, "flooded",
                   [Flood("idle", webhook.port, 900, str(webhook.certs.ca_cert)),  # more than the 1024 kept
                    Flood("half-hello", webhook.port, 300)])


def test_a_slice_pod_is_admitted_while_unfinished_handshakes_reconnect_as_fast_as_they_are_shed(
        controlplane, webhook, ns):
    """2,000 TCP connections that never finish TLS, half silent, half half a ClientHello, each one the listener
    sheds reopened at once: tens of thousands of handshakes begun, and kube-apiserver's calls still answered."""
    floods = [Flood("silent", webhook.port, 1000), Flood("half-hello", webhook.port, 1000)]
    admitted_under(controlplane, webhook, ns, "reconnected", floods)
    assert sum(f.opened for f in floods) > 2000  # shed connections came back


def admitted_under(controlplane, webhook, ns: str, prefix: str, floods: list[Flood]) -> None:
    """Hold the floods; three slice pods created meanwhile are admitted and stored as the rules fill them."""
    lt = LoopThread()
    stop = asyncio.Event()
    held = [asyncio.Event() for _ in floods]
    runs = [asyncio.run_coroutine_threadsafe(f.run(stop, h), lt.loop) for f, h in zip(floods, held, strict=True)]
    try:
        until_seen("the floods built up", lambda: all(h.is_set() for h in held), timeout=60, interval=0.2,
                   show=lambda _: [f.stats() for f in floods])
        time.sleep(1.0)
        for i in range(3):  # the API server's calls, with its pooled connections being shed around them
            r = apply(controlplane, ns, pod(f"{prefix}-{i}", {VGPU: 1, MEMORY: 32, CORE: 8}))
            assert r.returncode == 0, f"{r.stderr}\nwebhook closes: {closes(webhook)}\n{webhook.tail(20)}"
            obj = stored(controlplane, ns, f"{prefix}-{i}")
            assert obj["spec"]["schedulerName"] == "hami-scheduler"
            assert resources(obj)[0] == {VGPU: "1", MEMORY: "32", CORE: "8"}
        shed = metric(webhook, "hami_mt_webhook_connections_closed_total")
        assert shed > 0, "the flood never reached the connection limit"
        assert metric(webhook, "hami_mt_webhook_connections") <= 1024
    finally:
        lt.loop.call_soon_threadsafe(stop.set)
        for run in runs:  # the floods let go of their sockets before the loop goes
            run.result(30)
        lt.close()


def closes(webhook) -> str:
    """The listener's connection closes by reason, for a failure's message."""
    return ", ".join(line for line in webhook.metrics().splitlines()
                     if line.startswith("hami_mt_webhook_connections_closed_total{"))
