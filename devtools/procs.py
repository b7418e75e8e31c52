"""Ports, child processes and their cleanup, shared by the control plane, `make run` and the benchmark.

Every child is started in its own session (terminal signals reach only us, and the whole group can be
stopped at once) and dies with us, even when we are SIGKILLed: a test run or benchmark killed by a
timeout must not leave an apiserver, a webhook or a flood holding ports.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: How long a child gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 40


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports the kernel considers free now (held together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One loopback port the kernel considers free now."""
    return free_ports(1)[0]


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGKILL the child when we die, even by SIGKILL (or to send `sig`,
    for a child that cleans up after itself).

    atexit and finalizers cover every ending but SIGKILL and a crash; this covers those. SIGKILL, not
    SIGTERM: the control plane's children would get it at once, and an apiserver shutting down gracefully
    while etcd vanishes hangs for minutes retrying etcd. Linux ties the signal to the thread that started
    the child: start children from a thread that outlives them (the main one).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sig)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def autogroup_nice() -> int:
    """The nice value of this process's autogroup (0 where the kernel has none)."""
    try:
        found = re.search(r"nice (-?\d+)", Path("/proc/self/autogroup").read_text())
    except OSError:
        return 0
    return int(found.group(1)) if found else 0


def _in_session(death_signal: int) -> Callable[[], None]:
    """A preexec function for a child in a session of its own: dying with us, and in an autogroup as low as
    ours (a new session is a new autogroup at nice 0, so a service a low-weight step starts would otherwise
    take an equal share of the cores from everything else)."""
    dying, nice = die_with_parent(death_signal), autogroup_nice()

    def preexec() -> None:
        if dying is not None:
            dying()
        if nice > 0:
            with contextlib.suppress(OSError):
                Path("/proc/self/autogroup").write_text(str(nice))

    return preexec


def spawn(cmd: Sequence[str], log: Path, *, pipe: bool = False, env: dict[str, str] | None = None,
          cwd: Path | None = None, mode: str = "ab", death_signal: int = signal.SIGKILL) -> subprocess.Popen[bytes]:
    """Start a child in its own session (at our autogroup's weight), dying with us, its output in `log` (opened
    with `mode`).

    With `pipe` its stdout is a pipe (for a readiness line, a JSON result) and only stderr goes to `log`.
    """
    with open(log, mode) as fh:
        return subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if pipe else fh,
                                stderr=fh if pipe else subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=_in_session(death_signal))


def signal_group(pgid: int, sig: int) -> None:
    """Signal a child's process group; one that is gone already is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def terminate(proc: subprocess.Popen[Any], grace: float = STOP_GRACE_S,
              sig: int = signal.SIGTERM) -> int | None:
    """Send `sig` to the child's process group, SIGKILL the group after `grace` seconds, reap; the exit code.

    Only while the child is unreaped: after that its pid, and so its group id, may belong to someone else.
    """
    if proc.poll() is not None:
        return proc.returncode
    signal_group(proc.pid, sig)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        return proc.wait()


def cleanup(procs: list[subprocess.Popen[bytes]], workdir: Path | None) -> None:
    """Stop children newest first (an apiserver before its etcd), then remove the work dir.

    Made to run from `stop()`, from a finalizer of a garbage-collected owner, or at interpreter exit.
    """
    while procs:
        terminate(procs.pop())
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def wait_line(proc: subprocess.Popen[bytes], expected: bytes, timeout: float) -> bool:
    """Whether the child's first stdout line, within `timeout` seconds, is `expected` (`ready`, `holding`)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        return bool(sel.select(timeout)) and proc.stdout.readline().strip() == expected


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log ("" when it cannot be read)."""
    try:
        with path.open(errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines))
    except OSError:
        return ""


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of a process, in MiB, from /proc; empty when it is gone."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far, from /proc (OSError when it is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
