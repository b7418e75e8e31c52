"""devtools.procs: children that end when asked, and that never outlive the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from devtools import procs


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether `pid` has exited (a zombie counts: its parent is what reaps it) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = procs.free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= p < 65536 for p in ports)


def test_terminate_stops_the_whole_group_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    # A shell that ignores SIGTERM, with a grandchild: both must be gone after terminate.
    script = "trap '' TERM; sleep 300 & echo $! > grandchild; echo ready; wait"
    proc = procs.spawn(["sh", "-c", script], tmp_path / "log", pipe=True, cwd=tmp_path)
    assert procs.wait_line(proc, b"ready", 10)
    grandchild = int((tmp_path / "grandchild").read_text())
    code = procs.terminate(proc, grace=0.5)
    assert code == -signal.SIGKILL
    assert gone(grandchild)
    assert procs.terminate(proc) == code  # a second stop changes nothing


def test_a_child_dies_with_its_parent_even_when_the_parent_is_sigkilled(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom devtools import procs\n"
         "p = procs.spawn(['sleep', '300'], Path(sys.argv[1]) / 'log')\n"
         "print(p.pid, flush=True)\ntime.sleep(300)\n", str(tmp_path)],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not gone(child, 0.2)
    parent.kill()
    parent.wait()
    try:
        assert gone(child)
    finally:
        if not gone(child, 0):
            os.kill(child, signal.SIGKILL)


def test_cleanup_stops_every_child_and_removes_the_workdir(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    children = [procs.spawn(["sleep", "300"], tmp_path / f"log{i}") for i in range(2)]
    started = list(children)
    procs.cleanup(children, workdir)
    assert children == [] and not workdir.exists()
    assert [p.returncode for p in started] == [-signal.SIGTERM] * 2


def test_tail_is_the_end_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert procs.tail(log, 2) == "line 98\nline 99\n"
    assert procs.tail(tmp_path / "missing") == ""
