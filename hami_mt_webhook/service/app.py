"""The process, wired by concern: kopf keeps the lifecycle; `serving` answers reviews and probes on
listeners of our own; `watches` keeps the node view and the quota index; `failover` and `auditor` run beside
them; all of them reach kube-apiserver through `kube.client`.

kopf logs in, handles signals and runs the webhook server it is given (`settings.admission.server`);
the node view is fed by its own streaming watch beside it (`watches.nodewatch` says why).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from typing import Any

import kopf

from .auditor.loop import Auditor, AuditSettings
from .failover.peers import Failover, Peers
from .kube import client
from .serving import probes
from .serving.listener import Listener
from .serving.server import AdmissionServer
from .state import State
from .watches import nodewatch, quotawatch
from .watches.nodefeed import NodeFeed

__all__ = ["run"]

logger = logging.getLogger("hami_mt_webhook")


def register(registry: kopf.OperatorRegistry, state: State, auditor: Auditor | None = None) -> None:
    """kopf's part: the login (for its own API discovery), and the audit's start and stop (kopf's startup and
    cleanup: on SIGTERM the Lease is handed back before the process ends); Nodes are watched by `watches.nodewatch`."""

    @kopf.on.login(id="login", registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        return client.login(settings)

    if auditor is not None:
        @kopf.on.startup(id="audit", registry=registry)
        async def start_audit(**_: Any) -> None:
            auditor.start()

        @kopf.on.cleanup(id="audit", registry=registry)
        async def stop_audit(**_: Any) -> None:
            await auditor.stop()


async def run(state: State, server: AdmissionServer, *, health_addr: str, health_port: int,
              metrics_port: int | None, node_watch: str, node_selector: str | None,
              failover: Failover | None = None, audit: AuditSettings | None = None) -> None:
    """Run kopf (login, webhook server, signals) with the node and quota watches, the probe and metrics
    listeners, with `failover` the replicas' watch of each other, and with `audit` the
    background audit (`auditor`: one replica at a time)."""
    gc.freeze()  # modules and settings live as long as the process: no full collection need scan them
    registry = kopf.OperatorRegistry()
    settings = kopf.OperatorSettings()
    settings.admission.server = server
    settings.admission.managed = None  # the webhook configurations are static manifests
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.peering.standalone = True
    def login() -> kopf.ConnectionInfo | None:
        return client.login(settings)

    feed = NodeFeed(state.view, state.config, state.metrics)
    auditor = Auditor(state, login, audit, lambda: feed.unreadable) if audit is not None else None
    register(registry, state, auditor)

    nodes = nodewatch.node_watch(feed, login, node_watch, node_selector)
    watcher = asyncio.create_task(nodes.keep_running(), name="node watch")
    quotas = quotawatch.quota_watch(state.quotas, state.config, login, node_watch)
    quota_watcher = asyncio.create_task(quotas.keep_running(), name="quota watch")
    tasks = [watcher, quota_watcher]
    peers = None
    if failover is not None:
        peers = Peers(state, login, failover, port=health_port, mode=node_watch)
        tasks.append(asyncio.create_task(peers.run(), name="peers"))
    table = probes.routes(state, None if peers is None else peers.answer)
    ports = [health_port, *([metrics_port] if metrics_port else [])]
    listeners: list[Listener] = []
    try:
        # The webhook port's limits on every port the process opens: a flood of any of them must not take
        # the memory a review needs, nor the /readyz that keeps the replica in the Service.
        listeners = await probes.listen(state, table, health_addr, ports, server.limits)
        # An identity of our own: kopf's default asks the user database for the name of our uid, and the
        # image's 65532 has no entry there (podman adds one when it runs a container, containerd does not).
        identity: Any = f"hami-mt-webhook@{socket.gethostname()}"  # kopf's Identity, a str it does not export
        await kopf.operator(registry=registry, settings=settings, standalone=True, clusterwide=True,
                            identity=identity)
    finally:
        for task in tasks:
            task.cancel()
        await probes.stop(listeners)
