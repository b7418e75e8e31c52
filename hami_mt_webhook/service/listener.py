"""The HTTPS listener: every connection is bounded from accept to close, and drained on shutdown.

The webhook fails closed, so a client that can tie up the listener can stop GPU pods cluster-wide.
The listener therefore accepts connections itself and hands each socket to the TLS layer
(`loop.connect_accepted_socket`): a connection is counted and timed from the moment it is accepted,
not from when aiohttp first sees it after the handshake.
Each connection is in one phase at a time, and each phase has a deadline:

    silent     accepted, nothing received yet               handshake_timeout
    handshake  first byte received, TLS handshake not done  handshake_timeout
    new        waiting for the first request's first byte   idle_timeout
    idle       kept alive, waiting for the next request     idle_timeout
    reading    first byte seen, request not read whole      request_timeout (headers and body)
    busy       the handler works on the request             request_timeout
    writing    the answer is being written                  write_timeout

A connection past its deadline is aborted (no graceful TLS close, which a hostile peer would never
answer), except a kept-alive one: it gets a TLS close_notify first, so that an HTTP client sees the
close before it reuses the connection, and is aborted `close_grace` later. The TLS machinery (buffers,
an SSL object) is set up only once a client sends its first byte, so a silent connection costs a
socket.

At `max_connections` a new connection makes room rather than being refused, idle connections first
(as Go's http.Server and nginx shed idle connections): the oldest one silent for a second (a real
client sends its ClientHello at once), else the oldest one that is handshaking, has not sent a request since its
handshake, or is reading or writing; kept-alive connections go last, oldest first: they are how
kube-apiserver's connection pool looks, and closing one races its next request. A caller that
connected last is the last to go. Connections whose request is being answered are never closed to
make room; only when every connection is busy is a new one refused.

aiohttp still parses HTTP (`GuardedHandler`); on shutdown the listener stops accepting, answers what
arrives on open connections with `Connection: close` for up to `drain_seconds`, then waits for
in-flight requests and closes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
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
    max_connections: int = 1024  # TLS handshakes in progress included
    max_handshakes: int = 256  # of those, handshakes under way (each holds TLS buffers); the oldest gives way
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
        if min(self.max_connections, self.max_handshakes, self.max_body, self.big_body, self.big_concurrency) < 1:
            raise ValueError("listener limits max_connections, max_handshakes, max_body, big_body, big_concurrency "
                             "must be positive")


class Phase(enum.Enum):
    SILENT = "silent"
    HANDSHAKE = "handshake"
    NEW = "new"
    IDLE = "idle"
    READING = "reading"
    BUSY = "busy"
    WRITING = "writing"


#: Who makes room for a new connection, in this order (the oldest of each group first); BUSY never does.
#: The first group holds only connections silent for `SILENT_GRACE`: one just accepted may not have
#: been read yet.
SHED_ORDER = ((Phase.SILENT,), (Phase.SILENT, Phase.HANDSHAKE, Phase.NEW, Phase.READING, Phase.WRITING),
              (Phase.IDLE,))
SILENT_GRACE = 1.0


class Conn:
    """One accepted TCP connection, tracked from accept to close."""

    __slots__ = ("sock", "tls", "handler", "phase", "since", "accepted", "closed", "task", "waiting")

    def __init__(self, sock: socket.socket, accepted: float) -> None:
        self.sock = sock
        self.accepted = accepted
        self.waiting = False  # for the client's first byte, before any TLS state exists
        self.tls: asyncio.Transport | None = None  # once the handshake is done
        self.handler: GuardedHandler | None = None
        self.phase = Phase.HANDSHAKE
        self.since = 0.0
        self.closed = False
        self.task: asyncio.Task[Any] | None = None  # the handshake


class GuardedHandler(RequestHandler):
    """aiohttp's protocol, reporting each request's phases to the listener; no request bytes in errors."""

    def __init__(self, listener: Listener, conn: Conn, **kwargs: Any) -> None:
        super().__init__(listener.runner.server, loop=listener.loop, **kwargs)  # type: ignore[arg-type]
        self._listener = listener
        self._conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The TLS handshake is done: the connection waits for its first request."""
        self._conn.tls = transport  # type: ignore[assignment]
        self._listener._enter(self._conn, Phase.NEW)
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._listener._forget(self._conn)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self._conn.phase in (Phase.NEW, Phase.IDLE):  # a request's first byte starts its clock
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
        self.sock: socket.socket | None = None  # the listening socket
        self.draining = False
        self.on_close = on_close
        self.closed: Counter[str] = Counter()  # connections the listener closed, by reason
        self._phases: dict[Phase, dict[Conn, None]] = {p: {} for p in Phase}  # each in order of entry
        self._count = 0
        self._timeouts = {Phase.SILENT: limits.handshake_timeout, Phase.HANDSHAKE: limits.handshake_timeout,
                          Phase.NEW: limits.idle_timeout, Phase.IDLE: limits.idle_timeout,
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
        """Listen; connections are accepted here, not by the event loop's server, so that each one is
        counted and timed before its TLS handshake starts."""
        await self.runner.setup()
        family = socket.getaddrinfo(self.host or None, self.port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        self.sock = socket.create_server((self.host, self.port), family=family, backlog=1024)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.loop.add_reader(self.sock.fileno(), self._accept)
        self._sweeper = self.loop.create_task(self._sweep())

    # --- bookkeeping -------------------------------------------------------------------------------

    def _accept(self) -> None:
        """Take what the kernel has queued (a bounded batch, so other work keeps its turn)."""
        assert self.sock is not None
        for _ in range(64):
            try:
                sock, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors, say: the queued connection waits
                logger.warning("accepting a connection failed: %s", err)
                return
            self._accepted(sock)

    def _accepted(self, sock: socket.socket) -> None:
        if self.draining or (self._count >= self.limits.max_connections and not self._make_room()):
            self._note("refused")
            sock.close()
            return
        sock.setblocking(False)
        conn = Conn(sock, self.loop.time())
        self._count += 1
        self._enter(conn, Phase.SILENT)
        conn.waiting = True
        self.loop.add_reader(sock.fileno(), self._first_byte, conn)

    def _first_byte(self, conn: Conn) -> None:
        """The client sent something (or closed): now the TLS layer takes the socket."""
        self.loop.remove_reader(conn.sock.fileno())
        conn.waiting = False
        if not conn.closed:
            handshakes = self._phases[Phase.HANDSHAKE]
            if len(handshakes) >= self.limits.max_handshakes:  # bounded memory: the oldest gives way
                self._close(next(iter(handshakes)), "shed-handshake")
            self._enter(conn, Phase.HANDSHAKE)
            conn.task = self.loop.create_task(self._handshake(conn))

    async def _handshake(self, conn: Conn) -> None:
        def handler() -> GuardedHandler:
            conn.handler = GuardedHandler(self, conn, keepalive_timeout=self.limits.idle_timeout * 4,
                                          access_log=None, auto_decompress=False, lingering_time=1.0)
            return conn.handler

        try:
            await self.loop.connect_accepted_socket(handler, conn.sock, ssl=self.context,
                                                    ssl_handshake_timeout=self.limits.handshake_timeout + 1.0,
                                                    ssl_shutdown_timeout=self.limits.close_grace)
        except asyncio.CancelledError:  # shed, past its deadline, or the listener stops
            self._forget(conn)
        except Exception as err:  # a failed handshake: nothing to answer
            logger.debug("TLS handshake failed: %s", type(err).__name__)
            self._forget(conn)
            with contextlib.suppress(OSError):
                conn.sock.close()
        finally:
            conn.task = None

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
        """Close the connection now; only a kept-alive one gets a TLS close_notify, and `close_grace`."""
        if reason is not None and not conn.closed:
            self._note(reason)
        self._forget(conn)
        if conn.tls is not None:
            if conn.phase is Phase.IDLE:  # a client's pool should see the close: close_notify, then abort
                conn.tls.close()
                self.loop.call_later(self.limits.close_grace, conn.tls.abort)
            else:
                conn.tls.abort()
        elif conn.task is not None:  # mid-handshake: cancelling aborts the transport
            conn.task.cancel()
        else:
            if conn.waiting:
                conn.waiting = False
                self.loop.remove_reader(conn.sock.fileno())
            with contextlib.suppress(OSError):
                conn.sock.close()

    def _note(self, reason: str) -> None:
        self.closed[reason] += 1
        if self.on_close is not None:
            self.on_close(reason)

    def _make_room(self) -> bool:
        """Close one connection for a new one (see the module's docstring for the order)."""
        now = self.loop.time()
        for i, group in enumerate(SHED_ORDER):
            oldest: Conn | None = None
            for phase in group:
                conns = self._phases[phase]
                if conns:
                    first = next(iter(conns))
                    if oldest is None or first.accepted < oldest.accepted:
                        oldest = first
            if oldest is not None and (i or now - oldest.since >= SILENT_GRACE):
                self._close(oldest, f"shed-{oldest.phase.value}")
                return True
        return False

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
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
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
