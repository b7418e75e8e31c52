"""Hostile clients: what any pod that can reach the webhook's ports can try against their listeners.

Used by `make bench` (the "hostile clients" part) and by the end-to-end test that creates a pod
through kube-apiserver while a flood is held. A flood holds its connections open and opens a new one
whenever the server closes one, so the pressure lasts as long as the flood runs. 127.0.0.1 unless `--host`
names another address (a replica's pod IP, from inside a pod's network namespace on the node tier).

    python -m devtools.load.attacks idle --port 8443 --count 600   # until SIGTERM or --seconds

Kinds: idle (TLS done, nothing sent), slow-read (a whole review sent, the answer never read),
silent (TCP only), half-hello (half a TLS ClientHello), big (reviews of `--body-mib` MiB in a loop);
and in plain HTTP, for the probe port: slow-header (a request line, then a header byte every
`--trickle` seconds), plain-idle (one GET /livez answered, then nothing: a kept-alive connection).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson

from devtools import procs
from devtools.paths import REPO_ROOT

KINDS = ("idle", "slow-read", "silent", "half-hello", "big", "slow-header", "plain-idle")
HOST = "127.0.0.1"


def client_context(cafile: str | None) -> ssl.SSLContext:
    if cafile:
        return ssl.create_default_context(cafile=cafile)
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


def client_hello() -> bytes:
    """The first flight of a real TLS client, for a client that sends only part of it."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(None).wrap_bio(incoming, outgoing, server_hostname="hami-mt-webhook")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def post(path: str, body: bytes, *, close: bool = False, extra: str = "") -> bytes:
    """An HTTP/1.1 POST of a JSON body, as bytes."""
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}{extra}\r\n")
    return head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length: status, headers (lower-case names), body."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("closed before an answer")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


@dataclass
class Flood:
    """`count` connections of one kind held against a port; each one the server closes is reopened."""

    kind: str
    port: int
    count: int
    cafile: str | None = None
    body: bytes = b""
    path: str = "/mutate-pods"
    hold: float = 12.0  # slow readers cannot see a close without reading: each is replaced after this
    trickle: float = 10.0  # slow-header: seconds between header bytes
    source: str | None = None  # the address to connect from (127.0.0.2: one pod, not the callers measured)
    host: str = HOST  # the server's address: loopback, or a replica's pod IP from inside a pod's namespace
    opened: int = 0
    closed_by_server: int = 0
    answered: int = 0
    failed: int = 0
    open_now: int = 0
    _ctx: ssl.SSLContext = field(init=False)
    _hello: bytes = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown flood kind {self.kind!r}; choose from {', '.join(KINDS)}")
        self._ctx = client_context(self.cafile)
        self._hello = client_hello()

    async def run(self, stop: asyncio.Event, held: asyncio.Event | None = None) -> None:
        """Open the connections (at most 200 connecting at once), then keep them until `stop` is set."""
        gate = asyncio.Semaphore(200)
        tasks = [asyncio.create_task(self._slot(stop, gate)) for _ in range(self.count)]
        started = time.monotonic()
        while self.opened < self.count and not stop.is_set():
            await asyncio.sleep(0.05)
            if time.monotonic() - started >= 5:  # progress, on stderr (the log), while it builds up slowly
                print(orjson.dumps(self.stats()).decode(), file=sys.stderr, flush=True)
                started = time.monotonic()
        if held is not None:
            held.set()
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=10)  # a connection stuck in a TLS close is not worth more

    async def _slot(self, stop: asyncio.Event, gate: asyncio.Semaphore) -> None:
        while not stop.is_set():
            writer = None
            try:
                async with gate:
                    tls = self._ctx if self.kind in ("idle", "slow-read", "big") else None
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port, ssl=tls, limit=1 << 16,
                                                local_addr=(self.source, 0) if self.source else None), 10)
                self.opened += 1
                self.open_now += 1
                await self._hold(reader, writer)
            except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                self.failed += 1
                await asyncio.sleep(0.05)  # the server refused or cut us: try again, not in a hot loop
            finally:
                if writer is not None:
                    self.open_now -= 1
                    # A slot still closing when run() gave up on it is collected after its loop closed.
                    with contextlib.suppress(RuntimeError):
                        writer.transport.abort()

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.kind == "slow-header":
            writer.write(f"GET /readyz HTTP/1.1\r\nHost: {HOST}\r\nX-Slow: ".encode())
            while not await _closed_within(reader, self.trickle):
                writer.write(b"a")
            self.closed_by_server += 1
            return
        if self.kind == "plain-idle":
            writer.write(f"GET /livez HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            await read_answer(reader)
            self.answered += 1
        elif self.kind == "half-hello":
            writer.write(self._hello[: len(self._hello) // 2])
        elif self.kind == "slow-read":
            writer.write(post(self.path, self.body))
            await writer.drain()
            cast(asyncio.Transport, writer.transport).pause_reading()  # the answer is never read
            await asyncio.sleep(self.hold)
            return
        elif self.kind == "big":
            while True:
                writer.write(post(self.path, self.body))
                await writer.drain()
                status, _, _ = await read_answer(reader)
                self.answered += 1
                if status != 200:
                    self.failed += 1
        while await reader.read(1 << 16):  # idle, silent, half-hello: wait for the server's close
            pass
        self.closed_by_server += 1

    def stats(self) -> dict[str, int | str]:
        return {"kind": self.kind, "count": self.count, "opened": self.opened, "open_now": self.open_now,
                "closed_by_server": self.closed_by_server, "answered": self.answered, "failed": self.failed}


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (whatever it answers first is read)."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(1 << 16):
                pass
        return True
    except TimeoutError:
        return False


def review(mib: float = 0) -> bytes:
    """A slice pod's AdmissionReview, with about `mib` MiB of environment variables when asked."""
    from devtools.gpus import pod, review_body

    obj = pod("slice")
    obj["spec"]["containers"][0]["env"] += [
        {"name": f"BULK_{i}", "value": "v" * 40} for i in range(int(mib * 1024 * 1024 / 73))]
    return review_body(obj)


# --- what a well-behaved caller sees during a flood ---------------------------------------------------


async def fresh_review(port: int, cafile: str, body: bytes, path: str = "/mutate-pods",
                       timeout: float = 5.0) -> tuple[int, dict, float]:
    """One review on a new connection, as the API server sends after its pooled connections were cut:
    HTTP status (0: no answer), the decoded answer, seconds from connect to the whole answer."""
    started = time.perf_counter()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(HOST, port, ssl=client_context(cafile))
            writer.write(post(path, body, close=True))
            status, _, data = await read_answer(reader)
        return status, orjson.loads(data) if status == 200 else {}, time.perf_counter() - started
    except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, ValueError):
        return 0, {}, time.perf_counter() - started
    finally:
        if writer is not None:
            writer.transport.abort()


async def probe(port: int, path: str = "/readyz", timeout: float = 5.0) -> tuple[int, float]:
    """A kubelet-style HTTP GET on a new connection: status (0: none) and seconds."""
    started = time.perf_counter()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
            status, _, _ = await read_answer(reader)
        return status, time.perf_counter() - started
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
        return 0, time.perf_counter() - started
    finally:
        if writer is not None:
            writer.transport.abort()


async def time_to_close(port: int, cafile: str, first: bytes = b"", timeout: float = 120.0) -> float | None:
    """Seconds until the server closes a TLS connection that sends `first` (and reads any answer)."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=client_context(cafile))
    started = time.perf_counter()
    try:
        if first:
            writer.write(first)
            await read_answer(reader)
            started = time.perf_counter()
        async with asyncio.timeout(timeout):
            while await reader.read(1 << 16):
                pass
        return time.perf_counter() - started
    except TimeoutError:
        return None
    except (OSError, ssl.SSLError):
        return time.perf_counter() - started
    finally:
        writer.transport.abort()


class Flooder:
    """One flood in a process of its own (`main`), started behind `prefix` (a CPU pin, or `nsenter` into a
    pod's network namespace), from `source` and to `host` when given."""

    def __init__(self, kind: str, count: int, port: int, log: Path, *, prefix: Sequence[str] = (),
                 cafile: Path | None = None, source: str | None = None, host: str | None = None) -> None:
        cmd = [*prefix, sys.executable, "-m", "devtools.load.attacks", kind, "--port", str(port), "--count", str(count),
               *(["--cafile", str(cafile)] if cafile else []), *(["--source", source] if source else []),
               *(["--host", host] if host else [])]
        self.proc = procs.spawn(cmd, log, pipe=True, cwd=REPO_ROOT, mode="wb")

    def wait_holding(self, timeout: float) -> bool:
        return procs.wait_line(self.proc, b"holding", timeout)

    def stop(self) -> dict[str, Any]:
        """Stop the flood; its counts, as it printed them on the way out."""
        procs.signal_group(self.proc.pid, signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            procs.signal_group(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
        with contextlib.suppress(ValueError, IndexError):
            loaded: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
            return loaded
        return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one flood until SIGTERM or `--seconds`; print `holding` once it is up, then its counts as JSON."""
    p = argparse.ArgumentParser(prog="python -m devtools.load.attacks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--cafile")
    p.add_argument("--body-mib", type=float, default=2.5, help="big and slow-read: review size [2.5]")
    p.add_argument("--seconds", type=float, default=0, help="stop after this long [0: until SIGTERM]")
    p.add_argument("--trickle", type=float, default=10.0, help="slow-header: seconds between header bytes [10]")
    p.add_argument("--source", help="connect from this loopback address, e.g. 127.0.0.2 [the kernel's choice]")
    p.add_argument("--host", default=HOST, help=f"the server's address [{HOST}]")
    a = p.parse_args(argv)
    body = b""
    if a.kind in ("big", "slow-read"):
        body = review(a.body_mib if a.kind == "big" else 0)

    async def go() -> dict:
        flood = Flood(a.kind, a.port, a.count, a.cafile, body, trickle=a.trickle, source=a.source,
                      host=a.host)
        stop, held = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        if a.seconds:
            loop.call_later(a.seconds, stop.set)
        task = asyncio.create_task(flood.run(stop, held))
        await held.wait()
        print("holding", flush=True)
        await task
        return flood.stats()

    print(orjson.dumps(asyncio.run(go())).decode(), flush=True)
    return 0


def _exit_now(code: int) -> None:
    """Leave without closing what is left of the flood: thousands of sockets close with the process."""
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
