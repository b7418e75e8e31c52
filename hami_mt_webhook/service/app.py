"""The process: kopf keeps the lifecycle, `nodewatch` the node view; aiohttp answers reviews and probes.

kopf logs in, handles signals and runs the webhook server it is given (`settings.admission.server`);
the node view is fed by its own streaming watch beside it (`nodewatch` says why).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from typing import Any

import aiohttp.web
import kopf

from . import nodewatch, quotawatch
from .nodefeed import NodeFeed
from .peers import Failover, Peers
from .probes import health_app
from .server import AdmissionServer
from .state import State

__all__ = ["run"]

logger = logging.getLogger("hami_mt_webhook")


def register(registry: kopf.OperatorRegistry, state: State) -> None:
    """kopf's part: the login (for its own API discovery); Nodes are watched by `nodewatch`."""

    @kopf.on.login(id="login", registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        return nodewatch.login(settings)


async def run(state: State, server: AdmissionServer, *, health_addr: str, health_port: int,
              metrics_port: int | None, node_watch: str, node_selector: str | None,
              failover: Failover | None = None) -> None:
    """Run kopf (login, webhook server, signals) with the node and quota watches, the probe and metrics
    listeners, and with `failover` the replicas' watch of each other (`peers`)."""
    gc.freeze()  # modules and settings live as long as the process: no full collection need scan them
    registry = kopf.OperatorRegistry()
    register(registry, state)
    settings = kopf.OperatorSettings()
    settings.admission.server = server
    settings.admission.managed = None  # the webhook configurations are static manifests
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.peering.standalone = True
    def login() -> kopf.ConnectionInfo | None:
        return nodewatch.login(settings)

    nodes = nodewatch.node_watch(NodeFeed(state.view, state.config, state.metrics), login, node_watch,
                                 node_selector)
    watcher = asyncio.create_task(nodes.keep_running(), name="node watch")
    quotas = quotawatch.quota_watch(state.quotas, state.config, login, node_watch)
    quota_watcher = asyncio.create_task(quotas.keep_running(), name="quota watch")
    tasks = [watcher, quota_watcher]
    health = health_app(state)
    if failover is not None:
        peers = Peers(state, login, failover, port=health_port, mode=node_watch)
        health.router.add_get("/peers", peers.answer)
        tasks.append(asyncio.create_task(peers.run(), name="peers"))
    runners = []
    try:
        runner = aiohttp.web.AppRunner(health, access_log=None)
        await runner.setup()
        runners.append(runner)
        await aiohttp.web.TCPSite(runner, health_addr, health_port).start()
        if metrics_port and metrics_port != health_port:
            await aiohttp.web.TCPSite(runner, health_addr, metrics_port).start()
        # An identity of our own: kopf's default asks the user database for the name of our uid, and the
        # image's 65532 has no entry there (podman adds one when it runs a container, containerd does not).
        identity: Any = f"hami-mt-webhook@{socket.gethostname()}"  # kopf's Identity, a str it does not export
        await kopf.operator(registry=registry, settings=settings, standalone=True, clusterwide=True,
                            identity=identity)
    finally:
        for task in tasks:
            task.cancel()
        for runner in runners:
            await runner.cleanup()
