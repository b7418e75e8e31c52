"""The webhook server that kopf runs: kopf's webhook-server protocol, implemented directly.

kopf accepts any callable taking its webhook function and yielding client configs
(`settings.admission.server`); it then owns the server's lifecycle: started with the operator,
cancelled on SIGTERM. kopf's own servers are not used: their handler runs reviews through kopf's
generic admission machinery, while ours hands the bytes to `admission.review` (see `endpoint`), and
ours adds the listener's limits (`listener`) and certificates reloaded in place (`tls`). So kopf's
`fn` is accepted and never called.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import kopf

from ..state import State
from .connections import DEFAULT_LIMITS, Limits
from .endpoint import ReviewEndpoint
from .listener import Listener
from .tls import CertReloader

__all__ = ["AdmissionServer"]

logger = logging.getLogger("hami_mt_webhook")


class AdmissionServer:
    """HTTPS on `addr:port` for /mutate-pods, /validate-pods and /validate-workloads until cancelled."""

    def __init__(self, state: State, *, addr: str, port: int, certfile: str, pkeyfile: str,
                 reload_interval: float, cafile: str | None = None, client_ca: str | None = None,
                 limits: Limits | None = None) -> None:
        self.state = state
        self.addr, self.port = addr, port
        self.cafile = cafile
        self.reload_interval = reload_interval
        self.limits = limits or DEFAULT_LIMITS
        self.certificates = CertReloader(certfile, pkeyfile, client_ca, state.metrics)
        self.listening = asyncio.Event()
        self.listener: Listener | None = None

    async def __call__(self, fn: kopf.WebhookFn | None = None) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve until cancelled; yields the client config once, as kopf's protocol asks."""
        context = self.certificates.load()
        # /<id>, and /warn/<id> in rollout mode (SPEC.md §4.10)
        endpoint = ReviewEndpoint(self.state, self.limits)
        metrics = self.state.metrics
        self.listener = listener = Listener(endpoint, self.addr or "0.0.0.0", self.port or 0, context,
                                            self.limits, on_close=metrics.connection_closed)
        metrics.connections.set_function(lambda: listener.connections)
        await listener.start()
        try:
            self.port = listener.port
            logger.info("serving admission reviews on https://%s:%s", self.addr, self.port)
            self.listening.set()
            self.state.serving = True
            config = kopf.WebhookClientConfig(url=f"https://{self.addr}:{self.port}")
            if self.cafile:
                config["caBundle"] = base64.b64encode(Path(self.cafile).read_bytes()).decode()
            yield config
            while True:
                await asyncio.sleep(self.reload_interval)
                self.certificates.reload()
        finally:
            self.listening.clear()
            self.state.serving = False
            logger.info("draining: no new connections, finishing in-flight reviews")
            await asyncio.shield(listener.stop())
            endpoint.close()
