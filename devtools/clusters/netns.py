"""A network and mount namespace of our own, and loopback ports here that lead into it.

A real node needs addresses that are not loopback (a bridge, the node's IP, one per pod); they must
never exist, nor be reachable, outside the test. So the node tier runs every process in a network
namespace made here (`unshare --net`), held by one process and entered by the others with
`nsenter` (`Namespace.prefix`). It has no link to the machine's network: no packet can leave it.

It is a mount namespace too, private from the start: what kubelet and containerd mount (kubelet's root
dir, the pods' volumes and network namespaces, containerd's shm and overlays) stays in it and goes away
with it, and tmpfs over /run, /var/lib and /var/log keeps the paths they write without asking (shim
sockets, runc state, the CNI cache) off the machine's disk.

The test process stays outside, on the machine's loopback: `Namespace.forward(port)` is a loopback port
here whose connections are made inside, to 127.0.0.1:`port` (the socket is created by a thread that
entered the namespace, `setns(2)` being per thread for networks). kubectl, helm, urllib and aiohttp then
work as in the e2e tier, with no prefix and no second pytest inside the namespace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from devtools.procs import spawn, terminate

CLONE_NEWNET = 0x40000000
#: Paths a node writes to by default that we give a tmpfs inside the namespace (see the module docstring).
PRIVATE_TMPFS = ("/run", "/var/lib", "/var/log")


class NamespaceError(RuntimeError):
    """The namespace could not be made or entered."""


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise NamespaceError(f"setns({path}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


class Namespace:
    """A network + mount namespace held by one shell; `setup` is shell run in it first, as root (links and
    addresses), `on_exit` when the holder is stopped or when we die, even by SIGKILL (it is sent SIGTERM
    then): what cleans up after a test run that was killed."""

    def __init__(self, workdir: Path, setup: Sequence[str] = (), on_exit: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.setup = list(setup)
        self.on_exit = list(on_exit)
        self.holder: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._inside: concurrent.futures.ThreadPoolExecutor | None = None
        self._servers: list[asyncio.Server] = []
        self._forwards: dict[int, int] = {}

    @property
    def pid(self) -> int:
        if self.holder is None:
            raise NamespaceError("the namespace has not been made")
        return self.holder.pid

    @property
    def net(self) -> str:
        """The namespace's file: what `nsenter --net=` and `setns` take."""
        return f"/proc/{self.pid}/ns/net"

    def inode(self) -> int:
        return os.stat(self.net).st_ino

    @property
    def prefix(self) -> list[str]:
        """What to put before a command so it runs inside."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", f"--mount=/proc/{self.pid}/ns/mnt", "--"]

    def start(self, timeout: float = 10.0) -> Namespace:
        mounts = [f"mount -t tmpfs -o mode=0755 hmw-node {p}" for p in PRIVATE_TMPFS]
        on_exit = self.workdir / "namespace-exit.sh"
        on_exit.write_text("\n".join(["set +e", *self.on_exit, ""]))
        script = "\n".join([" && ".join(["ip link set lo up", *self.setup, *mounts, "echo ready"]),
                            "sleep infinity & held=$!",
                            f"trap 'kill $held; . {shlex.quote(str(on_exit))}' TERM INT HUP",
                            "wait $held || true"])
        self.holder = spawn(["unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-ec", script],
                            self.workdir / "namespace.log", pipe=True, death_signal=signal.SIGTERM)
        assert self.holder.stdout is not None
        # Not waiting.until: a blocking read of the holder's output, line by line, not a poll at an interval.
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline and self.holder.poll() is None:
            line = self.holder.stdout.readline()
            if line.strip() == b"ready":
                return self
        log = (self.workdir / "namespace.log").read_text(errors="replace")
        self.stop()
        raise NamespaceError(f"the namespace was not made ({shlex.join(['sh', '-ec', script])}):\n{log}")

    def run(self, *cmd: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside and capture its output."""
        done = subprocess.run([*self.prefix, *cmd], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise NamespaceError(f"{shlex.join(cmd)} exited with {done.returncode}: {done.stderr.strip()}")
        return done

    # forwarding ----------------------------------------------------------------------------------------

    def forward(self, port: int) -> int:
        """A loopback port here leading to 127.0.0.1:`port` inside (made once per port)."""
        if port not in self._forwards:
            loop = self._event_loop()
            self._forwards[port] = asyncio.run_coroutine_threadsafe(self._listen(port), loop).result(10)
        return self._forwards[port]

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            net = self.net
            self._inside = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="netns",
                                                                 initializer=_setns, initargs=(net,))
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="netns-forward")
            self._thread.start()
        return self._loop

    async def _listen(self, port: int) -> int:
        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._pipe(reader, writer, port)
        server = await asyncio.start_server(client, "127.0.0.1", 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self._inside, _inside_socket)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            up_reader, up_writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        for w in (writer, up_writer):
            w.close()

    # stopping ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Close the forwarded ports and end the holder: with nothing else inside, the namespace and its
        mounts are gone."""
        if self._loop is not None:
            async def close() -> None:
                for server in self._servers:
                    server.close()
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)
            if self._inside is not None:
                self._inside.shutdown(wait=False)
            self._loop = None
        if self.holder is not None:
            terminate(self.holder, grace=5)


def _inside_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock
