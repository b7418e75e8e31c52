"""Slice-pod traffic through the API server, every creation's outcome kept with its time.

What the node tier's uptime tests and the fault tier (`devtools.scenarios.faults`) measure a fault with: pods
created at a fixed rate (`creating`), each answer recorded (`PodCreator.outcomes`), from an event loop in
a thread of its own (`LoopThread`) so the tests and the fault code stay synchronous.
"""

from __future__ import annotations

import asyncio
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

__all__ = ["LoopThread", "Outcome", "PodCreator", "creating", "slice_pod"]

T = TypeVar("T")
#: The slice resource the traffic's pods ask for.
VGPU = "mthreads.com/vgpu"


def slice_pod(name: str) -> dict[str, Any]:
    """A pod asking for one slice (`vgpu: 1`), the traffic's default."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/app",
                                     "resources": {"limits": {VGPU: "1"}}}]}}


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
        self.stopped = False

    def start(self, rate: float, seconds: float) -> None:
        self.future = asyncio.run_coroutine_threadsafe(self._run(rate, seconds), self.lt.loop)

    def wait(self, timeout: float) -> None:
        self.future.result(timeout)

    def stop(self) -> None:
        """No more creations after this; `wait` then waits for the answers of those sent."""
        self.stopped = True

    async def _run(self, rate: float, seconds: float) -> None:
        url = f"{self.server}/api/v1/namespaces/{self.namespace}/pods"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx, limit=64)) as session:
            tasks = []
            start = time.monotonic()
            for i in range(int(rate * seconds)):
                if self.stopped:
                    break
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
                status, detail = r.status, "" if r.status == 201 else (await r.text())[:1000]
        except (aiohttp.ClientError, TimeoutError) as err:
            status, detail = 0, repr(err)
        self.outcomes.append(Outcome(i, sent, time.time() - sent, status, detail))
        self.results[status] += 1
        if status != 201:
            self.failures.append(f"pod {i}: " + (f"HTTP {status}: {detail}" if status else detail))


class _ControlPlane(Protocol):
    """What `creating` needs of a control plane (devtools.clusters.controlplane.ControlPlane)."""

    @property
    def server(self) -> str: ...
    @property
    def workdir(self) -> Path: ...
    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]: ...


#: A creation run with no end of its own (`creating`'s `seconds` None) is stopped by its block, long before this.
UNBOUNDED = 3600.0


@contextmanager
def creating(cp: _ControlPlane, lt: LoopThread, namespace: str, rate: float, seconds: float | None,
             manifest: Callable[[int], dict[str, Any]] | None = None, tail: float = 3.0) -> Iterator[PodCreator]:
    """Slice pods (`vgpu: 1`, or `manifest(i)`) created at `rate` a second for `seconds` in `namespace`, made
    here and deleted on leaving, every creation's outcome recorded with its time (`PodCreator.outcomes`):
    what a fault is measured with. Do the fault inside the block; leaving it waits for the last answer and
    judges nothing (`tests/node/test_uptime.load` asserts that all were created). With `seconds` None they
    go on until the block ends and `tail` seconds more (a renewal takes as long as it takes)."""
    cp.kubectl("create", "namespace", namespace)
    creator = PodCreator(lt, cp.server, cp.workdir, namespace, manifest or (lambda i: slice_pod(f"p{i}")))
    creator.start(rate, UNBOUNDED if seconds is None else seconds)
    try:
        yield creator
        if seconds is None:
            time.sleep(tail)
        else:
            creator.wait(seconds + 120)
    finally:
        if seconds is None:
            creator.stop()
            creator.wait(60)
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
