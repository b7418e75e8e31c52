"""`python -m devtools.controlplane up|down`: the local control plane from a shell, stopped from another.

`up` writes a state file (pids with their start times, ports, paths) into `--dir`; `down` reads it,
asks `up` to stop its children in order, and kills whatever a SIGKILLed `up` left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from devtools.binaries import ControlPlaneError
from devtools.controlplane import STOP_GRACE_S, ControlPlane
from hami_mt_webhook.service import certs

DEFAULT_RUN_DIR = Path.home() / ".cache" / "hami-mt-webhook" / "run"
STATE_FILE = "controlplane.json"
KUBECONFIG_FILE = "admin.kubeconfig"


def build_parser() -> argparse.ArgumentParser:
    """`python -m devtools.controlplane up|down`."""
    parser = argparse.ArgumentParser(prog="python -m devtools.controlplane",
                                     description="run a local etcd, kube-apiserver, kube-controller-manager and "
                                                 "kube-scheduler on loopback")
    actions = parser.add_subparsers(dest="controlplane_action", required=True)
    up = actions.add_parser("up", help="start, print the kubeconfig, and run until SIGINT/SIGTERM/SIGHUP")
    down = actions.add_parser("down", help=f"stop what `up` started (read from <dir>/{STATE_FILE})")
    for p in (up, down):
        p.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR,
                       help=f"where the state file and the work dir live (default: {DEFAULT_RUN_DIR})")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the API server")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.controlplane_action == "up":
        return _up(Path(args.dir).expanduser(), args.timeout)
    return _down(Path(args.dir).expanduser())


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks: tells a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]


def _same_process(entry: dict[str, Any]) -> bool:
    pid, start = entry.get("pid"), entry.get("start")
    return isinstance(pid, int) and start is not None and _proc_start(pid) == start


def _up(run_dir: Path, timeout: float) -> int:
    state_path, kubeconfig = run_dir / STATE_FILE, run_dir / KUBECONFIG_FILE
    if state_path.exists():
        state = json.loads(state_path.read_text())
        if _same_process(state.get("up", {})):
            print(f"a control plane is already running (pid {state['up']['pid']}); "
                  f"run `controlplane down --dir {run_dir}` first", file=sys.stderr)
            return 1
    stopping = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopping.set())
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}  # SIGHUP: the terminal closed
    cp = ControlPlane(workdir=run_dir, ready_timeout=timeout, controllers=True)
    try:
        try:
            cp.start()
        except ControlPlaneError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        entry = {name: {"pid": pid, "start": _proc_start(pid)} for name, pid in cp.pids.items()}
        state = {
            "up": {"pid": os.getpid(), "start": _proc_start(os.getpid())},
            **entry,
            "ports": {"etcd_client": cp.etcd_client_port, "etcd_peer": cp.etcd_peer_port,
                      "apiserver": cp.apiserver_port},
            "server": cp.server, "kubeconfig": str(kubeconfig), "workdir": str(cp.workdir),
        }
        # A path that stays the same across restarts, so one `export KUBECONFIG` keeps working.
        certs.write_atomic(kubeconfig, cp.kubeconfig.read_bytes(), 0o600)
        certs.write_atomic(state_path, json.dumps(state, indent=2).encode())
        print(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.server}", file=sys.stderr)
        print(kubeconfig)
        print(f"export KUBECONFIG={kubeconfig}", flush=True)
        while not stopping.wait(1.0):
            if exited := cp.exited():
                print(f"error: {', '.join(exited)} exited; see the logs in {cp.workdir}", file=sys.stderr)
                return 1
        return 0
    finally:
        cp.stop()
        state_path.unlink(missing_ok=True)
        kubeconfig.unlink(missing_ok=True)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _down(run_dir: Path) -> int:
    state_path = run_dir / STATE_FILE
    if not state_path.exists():
        print(f"nothing to stop: no {state_path}", file=sys.stderr)
        return 0
    state = json.loads(state_path.read_text())
    up = state.get("up", {})
    if _same_process(up):  # let `up` stop its children in order and clean up after itself
        os.kill(up["pid"], signal.SIGTERM)
        _wait_gone(up, 2 * STOP_GRACE_S + 5)
    # Whatever is left, e.g. after `up` was SIGKILLed; clients of the API server first, etcd last.
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        entry = state.get(name, {})
        if _same_process(entry):
            os.kill(entry["pid"], signal.SIGTERM)
            if not _wait_gone(entry, STOP_GRACE_S):
                os.kill(entry["pid"], signal.SIGKILL)
                _wait_gone(entry, 5)
    workdir = Path(state.get("workdir", ""))
    if workdir.is_relative_to(run_dir) and workdir != run_dir:  # never remove anything outside --dir
        shutil.rmtree(workdir, ignore_errors=True)
    (run_dir / KUBECONFIG_FILE).unlink(missing_ok=True)
    state_path.unlink(missing_ok=True)
    print("control plane stopped", file=sys.stderr)
    return 0


def _wait_gone(entry: dict[str, Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _same_process(entry):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
