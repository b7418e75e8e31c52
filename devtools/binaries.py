"""Where the control-plane binaries come from: `$HAMI_MT_CONTROLPLANE_BIN`, or the build script's cache."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-controlplane.sh"
BIN_ENV = "HAMI_MT_CONTROLPLANE_BIN"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "helm")
LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message carries the relevant log tail."""


def binaries() -> Path:
    """The directory with every binary in BINARIES.

    `$HAMI_MT_CONTROLPLANE_BIN` wins, for machines that already have the binaries; otherwise the
    build script builds them once into a versioned cache (progress goes to our stderr, since a first
    build takes many minutes and silence would look like a hang).
    """
    env_dir = os.environ.get(BIN_ENV)
    if env_dir:
        return _check_binaries(Path(env_dir), f"${BIN_ENV}")
    proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    for line in proc.stderr:  # stdout carries one line only, so reading it afterwards cannot block
        tail.append(line)
        sys.stderr.write(line)
        sys.stderr.flush()
    out = proc.stdout.read().strip()
    if proc.wait() != 0 or not out:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}:\n{''.join(tail)}")
    return _check_binaries(Path(out.splitlines()[-1]), str(BUILD_SCRIPT))


def _check_binaries(path: Path, source: str) -> Path:
    missing = [b for b in BINARIES if not os.access(path / b, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{source} names {path}, which lacks executable {', '.join(missing)}")
    return path
