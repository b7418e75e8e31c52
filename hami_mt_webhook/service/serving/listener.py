"""The listeners: every connection is bounded from accept to close, and drained on shutdown.

The webhook fails closed, so a client that can tie up the listener can stop GPU pods cluster-wide.
The listener therefore accepts connections itself: a connection is counted and timed from the moment
it is accepted, not from when its TLS handshake starts.
Each connection is in one phase at a time, and each phase has a deadline:

    silent     accepted, nothing received yet               handshake_timeout
    handshake  first byte received, TLS handshake not done  handshake_timeout
    new        waiting for the first request's first byte   idle_timeout
    idle       kept alive, waiting for the next request     idle_timeout
    reading    first byte seen, request not read whole      request_timeout (headers and body)
    busy       the responder works on the request           request_timeout
    writing    the answer is being written                  write_timeout

A connection past its deadline is aborted (no graceful TLS close, which a hostile peer would never
answer), except a kept-alive one: it gets a TLS close_notify first, so that an HTTP client sees the
close before it reuses the connection, and is aborted `close_grace` later; if its next request is
already waiting unread in the socket (the loop was busy), it is read instead. The TLS machinery (an SSL
object and its buffers) is set up only once a client sends its first byte, so a silent connection costs
a socket.

At `max_connections` a new connection makes room rather than being refused, idle connections first
(as Go's http.Server and nginx shed idle connections): the oldest one silent for a second (a real
client sends its ClientHello at once), else the one longest handshaking, waiting for a request since its
handshake, or reading or writing; kept-alive connections go last, the longest idle first: they are how
kube-apiserver's connection pool looks, and closing one races its next request. Age counts in the
phase, not since accept: a pooled connection minutes old that has just begun a request is the newest
reader, not the oldest connection. A caller that connected last is the last to go. Connections whose
request is being answered are never closed to make room; only when every connection is busy is a new
one refused. One address holding half of `max_connections` or more (one pod's flood) makes room among
its own connections, in the same order, and others arriving make room among its connections first: a
flood that reconnects as fast as it is shed would otherwise close everyone's newest connection within
a few hundred milliseconds (a probe whose request had not arrived yet, a review being read).

The probe and metrics ports are the same listener without TLS (`context=None`, `probes`): a connection
goes from silent straight to reading at its first byte, under the same deadlines and the same cap, so
thousands of idle or slow clients on any port cost the process no more than on the webhook port.

Each connection moves its own bytes (`connections.Conn`: TLS on the socket, HTTP/1.1 from `http11`);
on shutdown the listener stops accepting, answers what arrives on open connections with
`Connection: close` for up to `drain_seconds`, then waits for in-flight requests and closes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Callable

from .connections import SHED_ORDER, SILENT_GRACE, Conn, Limits, Peer, Phase, Responder

logger = logging.getLogger("hami_mt_webhook")

#: How long past its idle deadline a kept-alive connection with unread bytes is left to be read.
REQUEST_WAITING_GRACE = 1.0

#: Connections open at once that make a burst worth trimming the heap after (kube-apiserver keeps a few
#: dozen).
TRIM_AFTER = 256

#: Seconds without a large body (`Limits.big_body`) after which the heap is trimmed of what the large ones
#: left: long enough that a steady stream of them keeps its memory, short enough to matter.
TRIM_QUIET = 5.0


def trim_heap() -> bool:
    """Return free heap memory to the system: a full collection first, which also empties the interpreter's
    free lists, so that arenas of Python objects left with none are unmapped; then glibc's malloc_trim(0).
    False where there is no glibc."""
    gc.collect()
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):
        return False


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)  # loaded once: each CDLL makes a class, garbage for the collector


class Listener:
    """One port: HTTPS with a `context` (the webhook's), else plain HTTP (the probes'); `responder` answers
    each request, `Limits` bound every connection."""

    def __init__(self, responder: Responder, host: str, port: int, context: ssl.SSLContext | None,
                 limits: Limits, on_close: Callable[[str], None] | None = None) -> None:
        self.responder, self.host, self.port = responder, host, port
        self.context, self.limits = context, limits
        self.loop = asyncio.get_running_loop()
        self.sock: socket.socket | None = None  # the listening socket
        self.draining = False
        self.on_close = on_close
        self.closed: Counter[str] = Counter()  # connections the listener closed, by reason
        self._phases: dict[Phase, dict[Conn, None]] = {p: {} for p in Phase}  # each in order of entry
        self._peers: dict[str, Peer] = {}  # by client address: the same, for each one's own connections
        self._hog: Peer | None = None  # the address that held the most connections when it last connected
        self._count = 0
        self._timeouts = {Phase.SILENT: limits.handshake_timeout, Phase.HANDSHAKE: limits.handshake_timeout,
                          Phase.NEW: limits.idle_timeout, Phase.IDLE: limits.idle_timeout,
                          Phase.READING: limits.request_timeout, Phase.BUSY: limits.request_timeout,
                          Phase.WRITING: limits.write_timeout}
        self._sweeper: asyncio.Task[None] | None = None
        self._high = 0  # the most connections open since the heap was last trimmed
        self._big_at: float | None = None  # when the last large body was done with, since the last trim

    @property
    def connections(self) -> int:
        """Open connections, TLS handshakes included."""
        return self._count

    def phases(self) -> dict[str, int]:
        return {p.value: len(conns) for p, conns in self._phases.items()}

    async def start(self) -> None:
        """Listen; connections are accepted here, not by the event loop's server, so that each one is
        counted and timed before its TLS handshake starts."""
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
                sock, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors, say: the queued connection waits
                logger.warning("accepting a connection failed: %s", err)
                return
            self._accepted(sock, addr[0] if isinstance(addr, tuple) else "")

    def _accepted(self, sock: socket.socket, address: str = "") -> None:
        peer = self._peers.get(address) or Peer(address)
        if self.draining or (self._count >= self.limits.max_connections and not self._make_room(peer)):
            self._note("refused")
            sock.close()
            return
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # an answer goes out whole, at once
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Conn(sock, self, self.loop.time(), peer)
        self._peers[address] = peer
        peer.count += 1
        if self._hog is None or peer.count > self._hog.count:
            self._hog = peer
        self._count += 1
        self.enter(conn, Phase.SILENT)
        conn.start()

    def handshaking(self, conn: Conn) -> None:
        """The client sent its first byte: TLS starts, and handshakes under way stay bounded."""
        handshakes = self._phases[Phase.HANDSHAKE]
        if len(handshakes) >= self.limits.max_handshakes:  # bounded memory: the oldest gives way
            self._close(next(iter(handshakes)), "shed-handshake")
        self.enter(conn, Phase.HANDSHAKE)

    def big_done(self) -> None:
        """A large body was answered or cut off: the heap is trimmed once they stop coming (`_give_back`)."""
        self._big_at = self.loop.time()

    def enter(self, conn: Conn, phase: Phase) -> None:
        if conn.closed:
            return
        own = conn.peer.phases
        self._phases[conn.phase].pop(conn, None)
        own[conn.phase].pop(conn, None)
        conn.phase, conn.since = phase, self.loop.time()
        self._phases[phase][conn] = None
        own[phase][conn] = None

    def forget(self, conn: Conn) -> None:
        """The connection is gone (closed by either side)."""
        if not conn.closed:
            conn.closed = True
            self._phases[conn.phase].pop(conn, None)
            peer = conn.peer
            peer.phases[conn.phase].pop(conn, None)
            peer.count -= 1
            if not peer.count:
                del self._peers[peer.address]
                if self._hog is peer:
                    self._hog = None
            self._count -= 1

    def _close(self, conn: Conn, reason: str | None) -> None:
        """Close the connection now; only a kept-alive one gets a TLS close_notify, and `close_grace`."""
        if reason is not None and not conn.closed:
            self._note(reason)
        if conn.phase is Phase.IDLE:
            conn.close()
        else:
            conn.abort()

    def _note(self, reason: str) -> None:
        self.closed[reason] += 1
        if self.on_close is not None:
            self.on_close(reason)

    def _make_room(self, peer: Peer) -> bool:
        """Close one connection for a new one from `peer` (see the module's docstring for the order): among
        the connections of an address holding half the cap, if there is one, else among all."""
        half = self.limits.max_connections / 2
        if peer.count >= half:  # the flood's own new connection: room among its own, or none
            return self._shed(peer.phases)
        hog = self._hog
        if hog is not None and hog.count >= half and self._shed(hog.phases):
            return True
        return self._shed(self._phases)

    def _shed(self, phases: dict[Phase, dict[Conn, None]]) -> bool:
        now = self.loop.time()
        for i, group in enumerate(SHED_ORDER):
            oldest: Conn | None = None
            for phase in group:
                conns = phases[phase]
                if conns:
                    first = next(iter(conns))
                    # By time in the phase, not the connection's age: a kept-alive connection of
                    # kube-apiserver's that has just begun sending a request is the oldest of all.
                    if oldest is None or first.since < oldest.since:
                        oldest = first
            if oldest is not None and (i or now - oldest.since >= SILENT_GRACE):
                self._close(oldest, f"shed-{oldest.phase.value}")
                return True
        return False

    async def _sweep(self) -> None:
        interval = max(0.02, min(0.5, min(self._timeouts.values()) / 5))
        while True:
            await asyncio.sleep(interval)
            self.close_expired(self.loop.time())
            self._give_back()

    def _give_back(self) -> None:
        """Hand freed memory back to the system once what held it is gone: after a burst of connections (a
        handshake flood: their TLS state), or `TRIM_QUIET` after the last large body (its bytes and parsed
        objects). glibc keeps freed memory in its arenas, so the process would stay at its peak for life."""
        self._high = max(self._high, self._count)
        burst_gone = self._high >= TRIM_AFTER and self._count <= self._high // 4
        bodies_gone = self._big_at is not None and self.loop.time() - self._big_at >= TRIM_QUIET
        if burst_gone or bodies_gone:
            self._high, self._big_at = self._count, None
            trim_heap()

    def close_expired(self, now: float) -> None:
        """Close connections past their phase's deadline; each phase's connections are in order of entry.

        A kept-alive connection whose next request already waits in its socket is left for the read
        to pick up (for up to `REQUEST_WAITING_GRACE` past the deadline): on a busy loop the sweep can
        run before the read, and closing then would lose a request kube-apiserver has sent (a POST it
        does not retry, so a failed pod creation).
        """
        for phase, conns in self._phases.items():
            limit = self._timeouts[phase]
            while conns:
                conn = next(iter(conns))
                waited = now - conn.since
                if waited < limit:
                    break
                if phase is Phase.IDLE and waited < limit + REQUEST_WAITING_GRACE and conn.has_unread():
                    break  # the read comes first; the connections behind it wait for the next sweep
                self._close(conn, f"deadline-{phase.value}")

    # --- shutdown ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop accepting, drain open connections, then close; bounded by the limits' timeouts."""
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        self.draining = True
        for phase in (Phase.SILENT, Phase.HANDSHAKE):
            for conn in list(self._phases[phase]):
                self._close(conn, None)
        # What arrives on open connections is still answered, with Connection: close, for a while ...
        deadline = self.loop.time() + self.limits.drain_seconds
        while self._count and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        # ... then connections waiting for a request go, and those answering one get a last moment.
        for phase in (Phase.NEW, Phase.IDLE):
            for conn in list(self._phases[phase]):
                self._close(conn, None)
        deadline = self.loop.time() + self.limits.shutdown_timeout
        while self._count and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conns in self._phases.values():
            for conn in list(conns):
                self._close(conn, None)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
