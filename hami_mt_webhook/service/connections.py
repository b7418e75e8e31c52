"""One connection's state as the listener tracks it, and aiohttp's protocol reporting its phases.

`listener` explains the phases and their deadlines; this module holds the pieces it is built from.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

from aiohttp import hdrs
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

if TYPE_CHECKING:
    from .listener import Listener

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


#: Who makes room for a new connection, in this order (of each group, the longest in its phase first);
#: BUSY never does.
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
        server = listener.runner.server
        assert server is not None, "the runner is set up before connections are accepted"
        super().__init__(server, loop=listener.loop, **kwargs)
        self._listener = listener
        self._conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The TLS handshake is done: the connection waits for its first request."""
        self._conn.tls = cast(asyncio.Transport, transport)
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
