"""A TCP relay in front of kube-apiserver that a test can cut, as a network partition would.

TLS passes through untouched (the API server's certificate names 127.0.0.1), so the webhook talks to
the real API server; only the path between them can be broken and mended.
"""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import urlsplit


class Relay:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 443
        self.loop = asyncio.new_event_loop()
        self.open = True
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> Relay:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self.loop).result()
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()
        if self._server is not None:
            self.loop.call_soon_threadsafe(self._server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def cut(self) -> None:
        """Drop every relayed connection and refuse new ones."""
        self.open = False

        async def drop() -> None:
            for w in list(self.writers):
                w.transport.abort()
            self.writers.clear()

        asyncio.run_coroutine_threadsafe(drop(), self.loop).result(5)

    def mend(self) -> None:
        self.open = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.writers.discard(writer)
            writer.transport.abort()
