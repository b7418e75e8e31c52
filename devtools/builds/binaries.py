"""Where the control-plane binaries come from: `$HAMI_MT_CONTROLPLANE_BIN`, or the build script's cache
for the Kubernetes version `$HAMI_MT_KUBE_VERSION` names (the newest pinned one by default)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

from devtools.paths import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-controlplane.sh"
BIN_ENV = "HAMI_MT_CONTROLPLANE_BIN"
VERSION_ENV = "HAMI_MT_KUBE_VERSION"
#: One directory per pinned Kubernetes minor (`v1.30`, ...): the oldest is the floor the chart declares.
PINS_DIR = REPO_ROOT / "controlplane" / "pins" / "kubernetes"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "helm")
LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message carries the relevant log tail."""


def pinned_versions() -> list[str]:
    """The Kubernetes versions pinned in controlplane/pins/kubernetes/, oldest first:
    ["v1.30.14", ..., "v1.37.2"]."""
    found = []
    for go_mod in PINS_DIR.glob("v1.*/go.mod"):
        match = re.search(r"^require k8s\.io/kubernetes (v[0-9.]+)$", go_mod.read_text(), re.M)
        if match:
            found.append(match[1])
    return sorted(found, key=lambda v: tuple(int(n) for n in v[1:].split(".")))


def binaries(version: str | None = None) -> Path:
    """The directory with every binary in BINARIES, for `version` (newest, floor, 1.MINOR or 1.MINOR.PATCH;
    default `$HAMI_MT_KUBE_VERSION`, else newest).

    `$HAMI_MT_CONTROLPLANE_BIN` wins, for machines that already have the binaries; otherwise the
    build script builds them once into a versioned cache (progress goes to our stderr, since a first
    build takes many minutes and silence would look like a hang).
    """
    env_dir = os.environ.get(BIN_ENV)
    if env_dir:
        return _check_binaries(Path(env_dir), f"${BIN_ENV}")
    return _check_binaries(_built(version, BINARIES), str(BUILD_SCRIPT))


def helm() -> Path:
    """helm alone, for a step that needs no cluster (`make release`): the control plane's own helm, built
    without compiling etcd and Kubernetes when they are not in the cache yet."""
    env_dir = os.environ.get(BIN_ENV)
    if env_dir:
        return _check_binaries(Path(env_dir), f"${BIN_ENV}", ("helm",)) / "helm"
    return _check_binaries(_built(None, ("helm",)), str(BUILD_SCRIPT), ("helm",)) / "helm"


def _built(version: str | None, only: tuple[str, ...]) -> Path:
    """The build script's directory for `version`, once it holds `only`."""
    wanted = version or os.environ.get(VERSION_ENV) or "newest"
    env = {**os.environ, "KUBE_VERSION": wanted, "ONLY": "" if only == BINARIES else " ".join(only)}
    proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    for line in proc.stderr:  # stdout carries one line only, so reading it afterwards cannot block
        tail.append(line)
        with contextlib.suppress(OSError):  # a closed terminal or pipe must not end the build
            sys.stderr.write(line)
            sys.stderr.flush()
    out = proc.stdout.read().strip()
    if proc.wait() != 0 or not out:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}:\n{''.join(tail)}")
    return Path(out.splitlines()[-1])


def _check_binaries(path: Path, source: str, names: tuple[str, ...] = BINARIES) -> Path:
    missing = [b for b in names if not os.access(path / b, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{source} names {path}, which lacks executable {', '.join(missing)}")
    return path
