"""A TCP balancer in front of webhook processes, for the reliability tests (the pod traffic is
`devtools.load.traffic`).

The balancer plays the Service: new connections go round-robin to the backends in rotation, and
taking a backend out of rotation (the endpoint removal that a preStop pause waits for) leaves its
open connections alone, as kube-proxy does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from devtools.load.traffic import LoopThread


class Balancer:
    """A loopback TCP proxy: round-robin over the backends in rotation."""

    def __init__(self, lt: LoopThread, backends: list[int]) -> None:
        self.lt = lt
        self.rotation = list(backends)
        self._next = 0
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.connections: Counter[int] = Counter()
        self.open: set[asyncio.StreamWriter] = set()

    def start(self) -> None:
        async def go() -> None:
            self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
        self.lt.run(go(), 5)

    def remove(self, backend: int) -> None:
        self.rotation = [b for b in self.rotation if b != backend]

    def add(self, backend: int) -> None:
        if backend not in self.rotation:
            self.rotation = [*self.rotation, backend]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backends = list(self.rotation)
        if not backends:
            writer.close()
            return
        backend = backends[self._next % len(backends)]
        self._next += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend)
        except OSError:
            writer.close()
            return
        self.connections[backend] += 1
        self.open |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self.open -= {writer, up_writer}

    def cut(self) -> None:
        """A network partition: every backend out of rotation and every open connection dropped."""
        self.rotation = []

        async def go() -> None:
            for w in list(self.open):
                w.transport.abort()
        self.lt.run(go(), 5)

    def stop(self) -> None:
        async def go() -> None:
            if self.server is not None:
                self.server.close()
        self.lt.run(go(), 5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


