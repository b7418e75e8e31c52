"""Traffic for the reliability tests: a TCP balancer in front of webhook processes, and a pod creator
(`creating`: slice pods at a rate, every outcome timed, while a fault happens).

The balancer plays the Service: new connections go round-robin to the backends in rotation, and
taking a backend out of rotation (the endpoint removal that a preStop pause waits for) leaves its
open connections alone, as kube-proxy does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp

from tests.e2e.support import VGPU, pod

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread, so pytest's own code can stay synchronous."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


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


@dataclass(frozen=True)
class Outcome:
    """One creation: when it was sent (time.time()), how long its answer took, the HTTP status (0: no answer)
    and, unless created (201), what came back or the error."""

    index: int
    sent: float
    took: float
    status: int
    detail: str = ""


class PodCreator:
    """Creates pods through the API at a fixed rate and records every answer, with its time (`outcomes`)."""

    def __init__(self, lt: LoopThread, server: str, workdir: Path, namespace: str,
                 manifest: Callable[[int], dict[str, Any]]) -> None:
        self.lt, self.server, self.namespace, self.manifest = lt, server, namespace, manifest
        ctx = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
        ctx.load_cert_chain(workdir / "admin.crt", workdir / "admin.key")
        self.ctx = ctx
        self.results: Counter[int] = Counter()
        self.failures: list[str] = []
        self.outcomes: list[Outcome] = []
        self.future: Any = None

    def start(self, rate: float, seconds: float) -> None:
        self.future = asyncio.run_coroutine_threadsafe(self._run(rate, seconds), self.lt.loop)

    def wait(self, timeout: float) -> None:
        self.future.result(timeout)

    async def _run(self, rate: float, seconds: float) -> None:
        url = f"{self.server}/api/v1/namespaces/{self.namespace}/pods"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx, limit=64)) as session:
            tasks = []
            start = time.monotonic()
            for i in range(int(rate * seconds)):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._create(session, url, i)))
            await asyncio.gather(*tasks)

    async def _create(self, session: aiohttp.ClientSession, url: str, i: int) -> None:
        sent = time.time()
        try:
            async with session.post(url, data=json.dumps(self.manifest(i)),
                                    headers={"Content-Type": "application/json"},
                                    timeout=aiohttp.ClientTimeout(total=30)) as r:
                status, detail = r.status, "" if r.status == 201 else (await r.text())[:300]
        except (aiohttp.ClientError, TimeoutError) as err:
            status, detail = 0, repr(err)
        self.outcomes.append(Outcome(i, sent, time.time() - sent, status, detail))
        self.results[status] += 1
        if status != 201:
            self.failures.append(f"pod {i}: " + (f"HTTP {status}: {detail}" if status else detail))


class _ControlPlane(Protocol):
    """What `creating` needs of a control plane (devtools.controlplane.ControlPlane)."""

    @property
    def server(self) -> str: ...
    @property
    def workdir(self) -> Path: ...
    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]: ...


@contextmanager
def creating(cp: _ControlPlane, lt: LoopThread, namespace: str, rate: float, seconds: float,
             manifest: Callable[[int], dict[str, Any]] | None = None) -> Iterator[PodCreator]:
    """Slice pods (`vgpu: 1`, or `manifest(i)`) created at `rate` a second for `seconds` in `namespace`, made
    here and deleted on leaving, every creation's outcome recorded with its time (`PodCreator.outcomes`):
    what a fault is measured with. Do the fault inside the block; leaving it waits for the last answer and
    judges nothing (`tests/node/test_uptime.load` asserts that all were created)."""
    cp.kubectl("create", "namespace", namespace)
    creator = PodCreator(lt, cp.server, cp.workdir, namespace, manifest or (lambda i: pod(f"p{i}", {VGPU: 1})))
    creator.start(rate, seconds)
    try:
        yield creator
        creator.wait(seconds + 120)
    finally:
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
