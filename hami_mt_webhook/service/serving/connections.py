"""One connection, from its first byte to its close: TLS on the socket itself, then HTTP/1.1 requests
(or the requests straight away, on the plain-HTTP probe and metrics ports).

`listener` explains the phases and their deadlines and decides when a connection must go; this module
moves one connection's bytes. TLS runs on a non-blocking `ssl.SSLSocket` driven by the event loop's
readiness callbacks, so a request costs one `recv` and one `send` through OpenSSL, in C, rather than
asyncio's TLS protocol in Python (`docs/PERFORMANCE.md`, "The HTTP layer"). While a request is answered
or its answer written the connection reads nothing more, so a client cannot pile bytes up behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import select
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .http11 import CONTINUE, Answer, BadRequest, Head, answer, error_answer, head_end

__all__ = ["DEFAULT_LIMITS", "Limits"]

logger = logging.getLogger("hami_mt_webhook")

#: Bytes asked of OpenSSL per read: a whole AdmissionReview of a usual pod in one call.
READ_SIZE = 256 * 1024


@dataclass(frozen=True)
class Limits:
    """What one connection and the listener as a whole may take (docs/operating.md lists them)."""

    handshake_timeout: float = 5.0  # accept -> TLS handshake finished
    idle_timeout: float = 10.0  # waiting for a request's first byte; kube-apiserver reopens as it needs
    request_timeout: float = 10.0  # first byte -> whole request read, and again for the responder's answer
    write_timeout: float = 10.0  # the answer written out (a client that does not read it is cut)
    max_connections: int = 1024  # TLS handshakes in progress included
    max_handshakes: int = 256  # of those, handshakes under way (each holds TLS buffers); the oldest gives way
    max_body: int = 3 * 1024 * 1024
    big_body: int = 256 * 1024  # bodies this large are decoded in a thread, `big_concurrency` at a time
    # One: orjson holds the GIL while it decodes, so a second lane never decoded beside the first; it only
    # doubled the parsed reviews alive at once, the peak RSS and what Python's allocator keeps of it after
    # (docs/PERFORMANCE.md, issue 34).
    big_concurrency: int = 1
    close_grace: float = 1.0  # a graceful TLS close (after `Connection: close`) is aborted after this
    drain_seconds: float = 2.5
    shutdown_timeout: float = 1.5

    def __post_init__(self) -> None:
        for name in ("handshake_timeout", "idle_timeout", "request_timeout", "write_timeout", "close_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"listener limit {name} must be a positive number of seconds")
        if min(self.max_connections, self.max_handshakes, self.max_body, self.big_body,
               self.big_concurrency) < 1:
            raise ValueError("listener limits max_connections, max_handshakes, max_body, big_body, "
                             "big_concurrency must be positive")


#: The limits `serve` applies unless told otherwise (its --help shows these).
DEFAULT_LIMITS = Limits()


class Phase(enum.Enum):
    # Members are compared by identity, so they may hash by it: Enum's own __hash__ runs Python code, and
    # the listener hashes a phase on every change of it (four per request).
    __hash__ = object.__hash__

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

#: The phases in which a byte received begins a request: SILENT only on a plain-HTTP port (no handshake).
_WAITING = frozenset((Phase.SILENT, Phase.NEW, Phase.IDLE))


class Peer:
    """One client address's open connections, by phase, each in order of entry (`listener` says why)."""

    __slots__ = ("address", "count", "phases")

    def __init__(self, address: str) -> None:
        self.address, self.count = address, 0
        self.phases: dict[Phase, dict[Conn, None]] = {p: {} for p in Phase}


class Responder(Protocol):
    """What answers a request: the admission endpoint (`endpoint.ReviewEndpoint`), or the probes
    (`probes.ProbeResponder`); each reads the heads it takes (`parse`) and names its method (`allow`)."""

    big_lane: asyncio.Semaphore
    allow: bytes

    def parse(self, head: bytes) -> Head: ...

    def answer(self, head: Head, body: bytes) -> Answer: ...

    def answer_big(self, head: Head, body: bytes) -> Awaitable[Answer]: ...

    def refused(self, head: Head, status: int) -> None: ...


class Host(Protocol):
    """What a connection needs of its listener: the shared settings, and a place to report its phases."""

    loop: asyncio.AbstractEventLoop
    limits: Limits
    context: ssl.SSLContext | None  # None: plain HTTP
    responder: Responder
    draining: bool

    def enter(self, conn: Conn, phase: Phase) -> None: ...

    def forget(self, conn: Conn) -> None: ...

    def handshaking(self, conn: Conn) -> None: ...

    def big_done(self) -> None: ...


class Conn:
    """One accepted TCP connection, tracked from accept to close."""

    __slots__ = ("sock", "fd", "host", "peer", "tls", "phase", "since", "accepted", "closed", "task", "buf",
                 "head", "body", "out", "close_after", "_reader", "_writer")

    def __init__(self, sock: socket.socket, host: Host, accepted: float, peer: Peer) -> None:
        self.sock: socket.socket = sock
        self.fd = sock.fileno()
        self.host = host
        self.peer = peer
        self.accepted = accepted
        self.tls: ssl.SSLSocket | None = None  # from the client's first byte on; then also `sock`
        self.phase = Phase.SILENT
        self.since = 0.0
        self.closed = False
        self.task: asyncio.Task[Any] | None = None  # a large body's answer
        self.buf = bytearray()
        self.head: Head | None = None  # of the request being read
        self.body: asyncio.Future[bytes] | None = None  # a large body, awaited by `task`
        self.out: memoryview | None = None  # what is left of the answer being written
        self.close_after = False
        self._reader: Callable[[], None] | None = None
        self._writer: Callable[[], None] | None = None

    # --- readiness -----------------------------------------------------------------------------------

    def _watch(self, reader: Callable[[], None] | None, writer: Callable[[], None] | None = None) -> None:
        loop = self.host.loop
        if reader != self._reader:
            if self._reader is not None:
                loop.remove_reader(self.fd)
            if reader is not None:
                loop.add_reader(self.fd, reader)
            self._reader = reader
        if writer != self._writer:
            if self._writer is not None:
                loop.remove_writer(self.fd)
            if writer is not None:
                loop.add_writer(self.fd, writer)
            self._writer = writer

    def start(self) -> None:
        """Wait for the client's first byte; until then the connection costs a socket and nothing more.
        Without TLS the first byte is the request's: read as such, still under the silent phase's deadline."""
        self._watch(self._first_byte if self.host.context is not None else self._readable)

    def _first_byte(self) -> None:
        self._watch(None)
        context = self.host.context
        if self.closed or context is None:
            return
        self.host.handshaking(self)  # may make room by closing an older handshake
        try:
            self.tls = context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):  # the peer is already gone
            self.abort()
            return
        self.sock = self.tls
        self._handshake()

    def _handshake(self) -> None:
        tls = self.tls
        assert tls is not None
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(self._handshake)
            return
        except ssl.SSLWantWriteError:
            self._watch(None, self._handshake)
            return
        except (OSError, ValueError) as err:  # ssl.SSLError included: nothing to answer
            logger.debug("TLS handshake failed: %s", type(err).__name__)
            self.abort()
            return
        self.host.enter(self, Phase.NEW)
        self._watch(self._readable)
        self._readable()  # the first request may have come with the handshake's last flight

    # --- reading -------------------------------------------------------------------------------------

    def _readable(self) -> None:
        sock, tls = self.sock, self.tls
        got = 0
        try:
            while True:
                data = sock.recv(READ_SIZE)
                if not data:  # the client closed
                    self.abort()
                    return
                self.buf += data
                got += len(data)
                if tls is None or not tls.pending() or len(self.buf) > READ_SIZE:
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        except (OSError, ValueError):
            self.abort()
            return
        if got and self.phase in _WAITING:  # a request's first byte starts its clock
            self.host.enter(self, Phase.READING)
        self._process()

    def _process(self) -> None:
        """Take the next request from the buffer, as far as it has arrived."""
        limits = self.host.limits
        if self.head is None:
            try:
                end = head_end(self.buf)
                if end < 0:
                    return
                head = self.host.responder.parse(bytes(self.buf[:end]))
            except BadRequest as bad:
                self._refuse(bad.status)
                return
            del self.buf[:end + 4]
            if head.length > limits.max_body:
                self.host.responder.refused(head, 413)
                self._refuse(413)
                return
            self.head = head
            if head.expects_continue and len(self.buf) < head.length:
                self._send_now(CONTINUE)
            if head.length >= limits.big_body:  # read it only once the big lane has room
                self._watch(None)
                self.task = self.host.loop.create_task(self._answer_big(head))
                return
        head = self.head
        if len(self.buf) < head.length:
            return
        body = bytes(self.buf[:head.length])
        del self.buf[:head.length]
        # The large-body task waits for it: nothing more is read until it is answered.
        if self.body is not None:
            self._watch(None)
            self.body.set_result(body)
            return
        self.head = None
        self.host.enter(self, Phase.BUSY)
        # Answered before this callback returns, so nothing else is read meanwhile; an answer that cannot be
        # written at once swaps the reader for a writer until it is out (`_flush`).
        self._write(head, self.host.responder.answer(head, body))

    async def _answer_big(self, head: Head) -> None:
        """A large body: read it once the big lane has room, answer it off the loop (`endpoint`)."""
        responder = self.host.responder
        try:
            async with responder.big_lane:
                self.body = self.host.loop.create_future()
                self._watch(self._readable)
                self._process()
                body = await self.body
                self.body = None
                self.head = None
                self.host.enter(self, Phase.BUSY)
                reply = await responder.answer_big(head, body)
        finally:  # answered, or cut off on its way: either way its memory is free now
            self.host.big_done()
        self.task = None
        if not self.closed:
            self._write(head, reply)

    def has_unread(self) -> bool:
        """Whether the client has sent bytes not read yet (an idle connection's next request, say)."""
        if self.tls is not None and self.tls.pending():
            return True
        poll = select.poll()
        poll.register(self.fd, select.POLLIN)
        try:
            return any(event & select.POLLIN for _, event in poll.poll(0))
        except OSError:
            return False

    # --- writing -------------------------------------------------------------------------------------

    def _write(self, head: Head, reply: Answer) -> None:
        close = reply.close or not head.keep_alive or self.host.draining
        self.close_after = close
        self.out = memoryview(answer(reply.status, reply.body, close=close, content_type=reply.content_type))
        self.host.enter(self, Phase.WRITING)
        self._flush()

    def _refuse(self, status: int) -> None:
        """A request that cannot be served: a fixed answer that echoes nothing, then the close."""
        logger.debug("HTTP %d to a client", status)
        self.head = None
        self.buf.clear()
        self._watch(None)
        self.close_after = True
        self.out = memoryview(error_answer(status, self.host.responder.allow))
        self.host.enter(self, Phase.WRITING)
        self._flush()

    def _send_now(self, data: bytes) -> None:
        """A short interim answer (100 Continue), sent at once or not at all."""
        with contextlib.suppress(OSError, ValueError):
            self.sock.send(data)

    def _flush(self) -> None:
        sock = self.sock
        try:
            while self.out:  # OpenSSL writes all of it, or asks to be called again with the same bytes
                sent = sock.send(self.out)
                self.out = self.out[sent:]
        except (ssl.SSLWantWriteError, BlockingIOError):
            self._watch(None, self._flush)
            return
        except ssl.SSLWantReadError:
            self._watch(self._flush)
            return
        except (OSError, ValueError):
            self.abort()
            return
        self.out = None
        if self.close_after:
            self.close()
            return
        if self.buf:  # a pipelined request, already read: taken on the loop's next turn, not recursively here
            self.host.enter(self, Phase.READING)
            self._watch(None)
            self.host.loop.call_soon(self._next)
            return
        self.host.enter(self, Phase.IDLE)
        self._watch(self._readable)

    def _next(self) -> None:
        if not self.closed:
            self._watch(self._readable)
            self._process()

    # --- closing -------------------------------------------------------------------------------------

    def close(self) -> None:
        """A graceful close: TLS close_notify (a FIN without TLS), so an HTTP client sees the close before it
        reuses the connection, then the socket `close_grace` later (a hostile peer would never answer)."""
        if self.closed:
            return
        self._stop()
        if self.tls is None and self.host.context is not None:  # no TLS session yet: nothing to say
            self._release()
            return
        with contextlib.suppress(OSError, ValueError):
            if self.tls is not None:
                self.tls.unwrap()  # sends close_notify; the peer's answer is not awaited
            else:
                self.sock.shutdown(socket.SHUT_WR)
        self.host.loop.call_later(self.host.limits.close_grace, self._release)

    def abort(self) -> None:
        """Close now, without a word: past a deadline, shed, or the client is gone."""
        if self.closed:
            return
        self._stop()
        self._release()

    def _stop(self) -> None:
        self.host.forget(self)
        self._watch(None)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        self.task = None

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
