"""HAMi itself, built from a source tree of HAMi the developer fetched (`$HAMI_MT_HAMI_SOURCE`): its webhook
for the benchmark's `peers` part and its scheduler extender for the `hami` e2e tier.

Nothing of HAMi lives in this repository. Both binaries are built with the tree's own go.mod and go.sum
(the Go module proxy serves every module HAMi needs, not HAMi itself), into a cache outside the work
tree; Go's build cache makes a second build of the same tree take seconds. The webhook's main is this
project's (`devtools/clusters/hami_webhook/main.go`): HAMi ships its webhook only inside the scheduler binary, so
the main serves HAMi's own `routes.WebHookRoute()` handler the way that binary does, and goes into the
build through `go build -overlay`, which leaves the tree untouched.

    git clone https://github.com/Project-HAMi/HAMi && git -C HAMi checkout v2.10.0
    export HAMI_MT_HAMI_SOURCE=$PWD/HAMi
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from devtools import paths
from devtools.clusters import controllers
from devtools.procs import free_ports
from hami_mt_webhook.rules.config import HAMI_NAMESPACE, HAMI_SERVICE_ACCOUNTS

if TYPE_CHECKING:
    from devtools.clusters.controlplane import ControlPlane

SOURCE_ENV = "HAMI_MT_HAMI_SOURCE"
MODULE = "github.com/Project-HAMi/HAMi"
CACHE = paths.CACHE / "hami"
WEBHOOK_MAIN = Path(__file__).resolve().parent / "hami_webhook" / "main.go"
#: Where the overlay puts the webhook's main inside the tree (a directory HAMi does not have).
OVERLAY_DIR = "cmd/hami-mt-bench-webhook"
#: HAMi's device configuration (its `--device-config-file` format) with the Moore Threads section alone,
#: under the resource names HAMi's chart configures: the vendor's device plugin advertises them.
DEVICE_CONFIG = {"mthreads": {"resourceCountName": "mthreads.com/vgpu",
                              "resourceMemoryName": "mthreads.com/sgpu-memory",
                              "resourceCoreName": "mthreads.com/sgpu-core"}}
HOW = (f"set {SOURCE_ENV} to a HAMi source tree, e.g. `git clone https://github.com/Project-HAMi/HAMi && "
       f"git -C HAMi checkout v2.10.0 && export {SOURCE_ENV}=$PWD/HAMi` (Go and the module proxy build it)")


class Missing(RuntimeError):
    """No usable HAMi tree or Go toolchain; the message says what to do."""


@dataclass(frozen=True)
class Tree:
    """A HAMi source tree: where it is and which HAMi it is (a commit and `git describe`, when a git
    checkout; the VERSION file otherwise)."""

    path: Path
    commit: str
    version: str

    @property
    def label(self) -> str:
        return f"HAMi {self.version} ({self.commit})" if self.commit else f"HAMi {self.version}"


def tree(environ: dict[str, str] | None = None) -> Tree:
    """The tree `$HAMI_MT_HAMI_SOURCE` names, checked to be HAMi's module; `Missing` says why not."""
    env = os.environ if environ is None else environ
    raw = env.get(SOURCE_ENV, "").strip()
    if not raw:
        raise Missing(f"{SOURCE_ENV} is not set: {HOW}")
    path = Path(raw).expanduser().resolve()
    go_mod = path / "go.mod"
    if not go_mod.is_file():
        raise Missing(f"{SOURCE_ENV}={raw}: no go.mod there; {HOW}")
    first = go_mod.read_text(errors="replace").split("\n", 1)[0].strip()
    if first != f"module {MODULE}":
        raise Missing(f"{SOURCE_ENV}={raw}: go.mod declares {first!r}, not `module {MODULE}`")
    if shutil.which("go") is None:
        raise Missing("`go` is not on PATH: HAMi is built from its sources with Go")
    commit = _git(path, "rev-parse", "--short=7", "HEAD")
    version = _git(path, "describe", "--tags", "--always", "--dirty") or (
        (path / "VERSION").read_text().strip() if (path / "VERSION").is_file() else "unknown version")
    return Tree(path, commit, version)


def _git(path: Path, *args: str) -> str:
    if shutil.which("git") is None or not (path / ".git").exists():
        return ""
    done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _build(src: Tree, package: str, name: str, overlay: dict[str, str] | None = None) -> Path:
    """`go build` of `package` in the tree with its own go.mod; the binary in the cache, per tree."""
    out_dir = CACHE / (src.commit or "tree") / src.path.name
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / name
    cmd = ["go", "build", "-trimpath", "-o", str(out)]
    if overlay:
        spec = out_dir / f"{name}.overlay.json"
        spec.write_text(json.dumps({"Replace": overlay}))
        cmd.append(f"-overlay={spec}")
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}  # the tree is left as it is; cgo: HAMi links NVML
    done = subprocess.run([*cmd, package], cwd=src.path, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise Missing(f"building {package} in {src.path} failed ({done.returncode}):\n"
                      f"{done.stderr[-3000:]}")
    return out


def build_webhook(src: Tree) -> Path:
    """HAMi's webhook alone: this project's main around HAMi's handler (see the module's docstring)."""
    target = src.path / OVERLAY_DIR / "main.go"
    return _build(src, f"./{OVERLAY_DIR}", "hami-webhook", {str(target): str(WEBHOOK_MAIN)})


def build_scheduler(src: Tree) -> Path:
    """HAMi's scheduler binary (`cmd/scheduler`): the extender kube-scheduler calls, and its webhook."""
    return _build(src, "./cmd/scheduler", "hami-scheduler")


def write_device_config(path: Path) -> Path:
    """HAMi's device configuration file (YAML is a superset of JSON) for `--device-config-file`."""
    path.write_text(json.dumps(DEVICE_CONFIG, indent=2) + "\n")
    return path


#: The series HAMi's scheduler exports per card it has registered (cmd/scheduler/metrics.go).
_CARD_SERIES = re.compile(r'^hami_gpu_memory_limit_bytes\{([^}]*)\} (\S+)$', re.M)


@dataclass
class SchedulerExtender:
    """HAMi's scheduler (`build_scheduler`) as the extender of a local control plane's kube-scheduler:
    `ControlPlane(controllers=True, extender=SchedulerExtender(binary))` calls it once the API server is up.

    It serves plain HTTP on a free loopback port (HAMi's chart uses TLS only for its webhook), reads the
    Moore Threads section of its device configuration, logs in as its own service account,
    kube-system/hami-scheduler as HAMi's chart names it (bound to cluster-admin here: it patches pods and
    binds them; the annotation guard lets only that identity write its annotations, SPEC 4.6) and has no
    leader election, as with one replica.
    """

    binary: Path
    #: klog verbosity: 4 logs each card Fit looks at, 5 why it passed a card over.
    verbosity: int = 2
    url: str = ""
    metrics_url: str = ""
    log: Path = field(default=Path())

    def __call__(self, cp: ControlPlane) -> str:
        d = cp.workdir / "hami-scheduler"
        d.mkdir(exist_ok=True)
        config = write_device_config(d / "device-config.yaml")
        port, metrics = free_ports(2)
        self.log = d / "hami-scheduler.log"
        proc = cp.spawn([str(self.binary), f"--http_bind=127.0.0.1:{port}",
                         f"--scheduler-name={controllers.SCHEDULER_NAME}",  # the source of its events
                         f"--device-config-file={config}", f"--metrics-bind-address=127.0.0.1:{metrics}",
                         "--leader-elect=false", f"--v={self.verbosity}"],
                        self.log, env={"KUBECONFIG": str(login(cp, d / "kubeconfig"))})
        self.url, self.metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}/metrics"
        cp.wait_ready("hami-scheduler", proc, self.log, f"{self.url}/healthz")
        return self.url

    def cards(self) -> Counter[str]:
        """The cards HAMi has registered, per node: it reads nodes when one is added and every 15 s, so a
        test waits for this before it counts on HAMi knowing a node."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.metrics_url, timeout=10) as answer:
            return registered_cards(answer.read().decode())


def login(cp: ControlPlane, path: Path) -> Path:
    """A kubeconfig for HAMi's scheduler service account, made with cluster-admin rights, written to `path`."""
    name = HAMI_SERVICE_ACCOUNTS[0]
    cp.kubectl("create", "serviceaccount", name, "-n", HAMI_NAMESPACE)
    cp.kubectl("create", "clusterrolebinding", f"{name}-e2e", "--clusterrole=cluster-admin",
               f"--serviceaccount={HAMI_NAMESPACE}:{name}")
    token = cp.kubectl("create", "token", name, "-n", HAMI_NAMESPACE, "--duration=24h").stdout.strip()
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": "local", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_file)}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}]}))
    path.chmod(0o600)
    return path


def registered_cards(metrics: str) -> Counter[str]:
    """The cards per node in HAMi's scheduler metrics: one memory-limit series per card."""
    return Counter(dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("node", "")
                   for labels, _ in _CARD_SERIES.findall(metrics))
