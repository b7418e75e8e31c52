"""The HTTPS listener: every connection is bounded from accept to close, and drained on shutdown.

The webhook fails closed, so a client that can tie up the listener can stop GPU pods cluster-wide.
The listener therefore accepts plain TCP and runs the TLS handshake itself (`loop.start_tls`): a
connection is counted and timed from the moment it is accepted, not from when aiohttp first sees it.
Each connection is in one phase at a time, and each phase has a deadline:

    handshake  accepted, TLS handshake not finished          handshake_timeout
    idle       waiting for a request's first byte           idle_timeout (first request and kept-alive)
    reading    first byte seen, request not read whole      request_timeout (headers and body)
    busy       the handler works on the request             request_timeout
    writing    the answer is being written                  write_timeout

A connection past its deadline is aborted: no graceful TLS close, which a hostile peer would never
answer. At `max_connections` a new connection makes room rather than being refused: the connection
idle longest is closed first, then the oldest of those handshaking, reading or writing (as Go's
http.Server and nginx shed idle connections). Connections whose request is being answered are never
closed to make room; only when every connection is busy is a new one refused.

aiohttp still parses HTTP (`GuardedHandler`); on shutdown the listener stops accepting, answers what
arrives on open connections with `Connection: close` for up to `drain_seconds`, then waits for
in-flight requests and closes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import aiohttp.web
from aiohttp import hdrs
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

logger = logging.getLogger("hami_mt_webhook")

#: The `Server:` header: the name only, never a library or version.
SERVER_NAME = "hami-mt-webhook"


@dataclass(frozen=True)
class Limits:
    """What one connection and the listener as a whole may take (docs/operating.md lists them)."""

    handshake_timeout: float = 5.0  # accept -> TLS handshake finished
    idle_timeout: float = 10.0  # waiting for a request's first byte; kube-apiserver reopens as it needs
    request_timeout: float = 10.0  # first byte -> whole request read, and again for the handler's answer
    write_timeout: float = 10.0  # the answer written out (a client that does not read it is cut)
    max_connections: int = 512  # TLS handshakes in progress included
    max_body: int = 3 * 1024 * 1024
    big_body: int = 256 * 1024  # bodies this large are decoded in a thread, `big_concurrency` at a time
    big_concurrency: int = 2
    close_grace: float = 1.0  # a graceful TLS close (after `Connection: close`) is aborted after this
    drain_seconds: float = 2.5
    shutdown_timeout: float = 1.5

    def __post_init__(self) -> None:
        for name in ("handshake_timeout", "idle_timeout", "request_timeout", "write_timeout", "close_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"listener limit {name} must be a positive number of seconds")
        if self.max_connections < 1 or self.max_body < 1 or self.big_body < 1 or self.big_concurrency < 1:
            raise ValueError("listener limits max_connections, max_body, big_body, big_concurrency must be positive")


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    IDLE = "idle"
    READING = "reading"
    BUSY = "busy"
    WRITING = "writing"


#: Who makes room for a new connection, in order; BUSY connections never do.
SHED_FIRST = (Phase.IDLE,)
SHED_THEN = (Phase.HANDSHAKE, Phase.READING, Phase.WRITING)


class Conn:
    """One accepted TCP connection, tracked from accept to close."""

    __slots__ = ("raw", "tls", "handler", "phase", "since", "closed", "task")

    def __init__(self, raw: asyncio.Transport) -> None:
        self.raw = raw
        self.tls: asyncio.Transport | None = None
        self.handler: GuardedHandler | None = None
        self.phase = Phase.HANDSHAKE
        self.since = 0.0
        self.closed = False
        self.task: asyncio.Task[None] | None = None


class _Accept(asyncio.Protocol):
    """The raw TCP protocol, only until the TLS layer takes the transport over."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.listener._accepted(transport)  # type: ignore[arg-type]


class Tap(asyncio.Protocol):
    """The TLS layer's application protocol: forwards to aiohttp's handler once it is attached, and
    tells the listener when the connection ends (the raw transport's own protocol is the TLS layer)."""

    def __init__(self, listener: Listener, conn: Conn) -> None:
        self.listener, self.conn = listener, conn
        self.handler: GuardedHandler | None = None
        self.early: list[bytes] = []  # bytes decrypted between the handshake and `attach`
        self.eof = False
        self.lost = False

    def attach(self, handler: GuardedHandler, transport: asyncio.Transport) -> None:
        self.handler = handler
        handler.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            handler.data_received(data)
        if self.eof:
            handler.eof_received()

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            self.early.append(data)
        else:
            self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        return self.handler.eof_received() if self.handler is not None else None

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.listener._forget(self.conn)
        if self.handler is not None:
            self.handler.connection_lost(exc)


class GuardedHandler(RequestHandler):
    """aiohttp's protocol, reporting each request's phases to the listener; no request bytes in errors."""

    def __init__(self, listener: Listener, conn: Conn, **kwargs: Any) -> None:
        super().__init__(listener.runner.server, loop=listener.loop, **kwargs)  # type: ignore[arg-type]
        self._listener = listener
        self._conn = conn

    def data_received(self, data: bytes) -> None:
        if data and self._conn.phase is Phase.IDLE:  # the first byte of a request starts its clock
            self._listener._enter(self._conn, Phase.READING)
        super().data_received(data)

    def request_read(self) -> None:
        """The handler has the whole body: the answer's own clock starts."""
        if self._conn.phase is Phase.READING:
            self._listener._enter(self._conn, Phase.BUSY)

    async def finish_response(self, request: BaseRequest, resp: StreamResponse,
                              start_time: float | None) -> tuple[StreamResponse, bool]:
        conn = self._conn
        self._listener._enter(conn, Phase.WRITING)
        if not resp.prepared:
            resp.headers[hdrs.SERVER] = SERVER_NAME
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            if conn.phase is Phase.WRITING:  # next: a pipelined request already read, or the idle wait
                self._listener._enter(conn, Phase.READING if self._messages else Phase.IDLE)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> StreamResponse:
        """A fixed answer per status: aiohttp's own would echo the offending request bytes."""
        if status >= 500:
            self.log_exception("error handling a request", exc_info=exc)
        else:
            logger.debug("HTTP %d to a client: %s", status, type(exc).__name__ if exc else "bad request")
        if request.writer.output_size > 0:
            raise ConnectionError("the answer is partly sent; no error answer can follow")
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        resp = Response(status=status, text=f"{status} {phrase}\n", content_type="text/plain")
        resp.force_close()
        return resp


class Listener:
    """An aiohttp application served over TLS with `Limits`, started and drained explicitly."""

    def __init__(self, app: aiohttp.web.Application, host: str, port: int, context: ssl.SSLContext,
                 limits: Limits, on_close: Callable[[str], None] | None = None) -> None:
        self.app, self.host, self.port, self.context, self.limits = app, host, port, context, limits
        self.runner = aiohttp.web.AppRunner(app, access_log=None)
        self.loop = asyncio.get_running_loop()
        self.server: asyncio.base_events.Server | None = None
        self.draining = False
        self.on_close = on_close
        self.closed: Counter[str] = Counter()  # connections the listener closed, by reason
        self._phases: dict[Phase, dict[Conn, None]] = {p: {} for p in Phase}  # each in order of entry
        self._count = 0
        self._timeouts = {Phase.HANDSHAKE: limits.handshake_timeout, Phase.IDLE: limits.idle_timeout,
                          Phase.READING: limits.request_timeout, Phase.BUSY: limits.request_timeout,
                          Phase.WRITING: limits.write_timeout}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def refused(self) -> int:
        """Connections closed on arrival (every connection busy, or draining)."""
        return self.closed["refused"]

    @property
    def cut_off(self) -> int:
        """Connections closed for missing a deadline (a handshake, a request, an answer not read)."""
        return sum(n for reason, n in self.closed.items() if reason.startswith("deadline"))

    @property
    def connections(self) -> int:
        """Open connections, TLS handshakes included."""
        return self._count

    def phases(self) -> dict[str, int]:
        return {p.value: len(conns) for p, conns in self._phases.items()}

    async def start(self) -> None:
        await self.runner.setup()
        self.server = await self.loop.create_server(lambda: _Accept(self), self.host, self.port,
                                                    reuse_address=True, backlog=1024)
        if self.port == 0:
            self.port = self.server.sockets[0].getsockname()[1]
        self._sweeper = self.loop.create_task(self._sweep())

    # --- bookkeeping -------------------------------------------------------------------------------

    def _accepted(self, raw: asyncio.Transport) -> None:
        if self.draining or (self._count >= self.limits.max_connections and not self._make_room()):
            self._note("refused")
            raw.abort()
            return
        raw.pause_reading()  # the ClientHello is for the TLS layer, which takes over below
        conn = Conn(raw)
        self._count += 1
        self._enter(conn, Phase.HANDSHAKE)
        conn.task = self.loop.create_task(self._handshake(conn))

    async def _handshake(self, conn: Conn) -> None:
        tap = Tap(self, conn)
        try:
            tls = await self.loop.start_tls(conn.raw, tap, self.context, server_side=True,
                                            ssl_handshake_timeout=self.limits.handshake_timeout + 1.0,
                                            ssl_shutdown_timeout=self.limits.close_grace)
        except asyncio.CancelledError:
            self._close(conn, None)
            raise
        except Exception as err:  # a failed or cut handshake: nothing to answer
            logger.debug("TLS handshake failed: %s", type(err).__name__)
            self._close(conn, None)
            return
        finally:
            conn.task = None
        if tls is None or tap.lost or conn.closed:
            self._close(conn, None)
            return
        conn.tls = tls
        handler = GuardedHandler(self, conn, keepalive_timeout=self.limits.idle_timeout * 4, access_log=None,
                                 auto_decompress=False, lingering_time=1.0)
        conn.handler = handler
        self._enter(conn, Phase.IDLE)
        tap.attach(handler, tls)

    def _enter(self, conn: Conn, phase: Phase) -> None:
        if conn.closed:
            return
        self._phases[conn.phase].pop(conn, None)
        conn.phase, conn.since = phase, self.loop.time()
        self._phases[phase][conn] = None

    def _forget(self, conn: Conn) -> None:
        """The connection is gone (closed by either side)."""
        if not conn.closed:
            conn.closed = True
            self._phases[conn.phase].pop(conn, None)
            self._count -= 1

    def _close(self, conn: Conn, reason: str | None) -> None:
        """Abort the connection now: no graceful TLS close for a peer that may never answer it."""
        if reason is not None and not conn.closed:
            self._note(reason)
        self._forget(conn)
        if conn.handler is not None:
            conn.handler.force_close()
        conn.raw.abort()

    def _note(self, reason: str) -> None:
        self.closed[reason] += 1
        if self.on_close is not None:
            self.on_close(reason)

    def _make_room(self) -> bool:
        """Close one connection for a new one: the longest idle, else the oldest not being answered."""
        for phase in SHED_FIRST:
            conns = self._phases[phase]
            if conns:
                self._close(next(iter(conns)), f"shed-{phase.value}")
                return True
        oldest: Conn | None = None
        for phase in SHED_THEN:
            conns = self._phases[phase]
            if conns:
                first = next(iter(conns))
                if oldest is None or first.since < oldest.since:
                    oldest = first
        if oldest is None:
            return False
        self._close(oldest, f"shed-{oldest.phase.value}")
        return True

    async def _sweep(self) -> None:
        """Close connections past their phase's deadline; each phase's connections are in order of entry."""
        interval = max(0.02, min(0.5, min(self._timeouts.values()) / 5))
        while True:
            await asyncio.sleep(interval)
            now = self.loop.time()
            for phase, conns in self._phases.items():
                limit = self._timeouts[phase]
                while conns:
                    conn = next(iter(conns))
                    if now - conn.since < limit:
                        break
                    self._close(conn, f"deadline-{phase.value}")

    # --- shutdown ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop accepting, drain open connections, then close; bounded by the limits' timeouts."""
        if self.server is not None:
            self.server.close()
        self.draining = True
        for conn in list(self._phases[Phase.HANDSHAKE]):
            self._close(conn, None)
        deadline = self.loop.time() + self.limits.drain_seconds
        while self.runner.server is not None and self.runner.server.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.runner.server is not None:
            await self.runner.server.shutdown(self.limits.shutdown_timeout)
        for phase in self._phases.values():
            for conn in list(phase):
                self._close(conn, None)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.runner.cleanup()
