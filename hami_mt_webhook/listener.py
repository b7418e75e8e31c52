"""The HTTPS listener: limits that keep a slow or greedy client from hurting it, and a graceful drain.

aiohttp parses HTTP; this module decides who gets a connection and for how long:
- a request must arrive whole, headers and body, within `request_timeout` of its first byte (a client
  that sends a byte a second is cut off);
- at most `max_connections` at once (more are closed on arrival);
- the TLS handshake must finish within `handshake_timeout`;
- on shutdown it stops accepting, answers what arrives on open connections with `Connection: close`
  for up to `drain_seconds` (so the API server's pooled connections close cleanly after a response
  rather than racing a close), then waits for in-flight requests and closes the rest.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp.web
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger("hami_mt_webhook")


@dataclass(frozen=True)
class Limits:
    request_timeout: float = 10.0
    handshake_timeout: float = 5.0
    keepalive_timeout: float = 75.0
    max_connections: int = 512
    max_body: int = 3 * 1024 * 1024
    drain_seconds: float = 2.5
    shutdown_timeout: float = 1.5


class GuardedHandler(RequestHandler):
    """aiohttp's protocol with a deadline on reading each request and a connection cap."""

    def __init__(self, listener: Listener, **kwargs: Any) -> None:
        super().__init__(listener.runner.server, loop=listener.loop, **kwargs)  # type: ignore[arg-type]
        self._listener = listener
        self._deadline: asyncio.TimerHandle | None = None
        self._reading = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        listener = self._listener
        if listener.draining or len(listener.runner.server.connections) > listener.limits.max_connections:
            listener.refused += 1
            self.force_close()
            transport.close()

    def data_received(self, data: bytes) -> None:
        if data and not self._reading:  # the first byte of a request starts its clock
            self._reading = True
            self._deadline = self._loop.call_later(self._listener.limits.request_timeout, self._too_slow)
        super().data_received(data)

    def request_read(self) -> None:
        """The handler has the whole body: the clock stops until the next request's first byte."""
        self._reading = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.request_read()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self._deadline = None
        self._listener.cut_off += 1
        self.force_close()
        if self.transport is not None:
            self.transport.close()


class Listener:
    """An aiohttp application served over TLS with `Limits`, started and drained explicitly."""

    def __init__(self, app: aiohttp.web.Application, host: str, port: int, context: ssl.SSLContext,
                 limits: Limits) -> None:
        self.app, self.host, self.port, self.context, self.limits = app, host, port, context, limits
        self.runner = aiohttp.web.AppRunner(app, access_log=None, keepalive_timeout=limits.keepalive_timeout)
        self.loop = asyncio.get_running_loop()
        self.server: asyncio.base_events.Server | None = None
        self.draining = False
        self.refused = 0  # connections closed on arrival (over the cap, or while draining)
        self.cut_off = 0  # connections closed for sending headers too slowly

    async def start(self) -> None:
        await self.runner.setup()
        self.server = await self.loop.create_server(
            lambda: GuardedHandler(self, keepalive_timeout=self.limits.keepalive_timeout, access_log=None),
            self.host, self.port, ssl=self.context, ssl_handshake_timeout=self.limits.handshake_timeout,
            reuse_address=True, backlog=512)
        if self.port == 0:
            self.port = self.server.sockets[0].getsockname()[1]

    @property
    def connections(self) -> int:
        return len(self.runner.server.connections) if self.runner.server else 0

    async def stop(self) -> None:
        """Stop accepting, drain open connections, then close; bounded by the limits' timeouts."""
        if self.server is not None:
            self.server.close()
        self.draining = True
        deadline = self.loop.time() + self.limits.drain_seconds
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.runner.server is not None:
            await self.runner.server.shutdown(self.limits.shutdown_timeout)
        await self.runner.cleanup()
