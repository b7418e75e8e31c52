"""cert-manager on the node tier's clusters, installed as users install it: its own Helm chart (from the Go
module github.com/cert-manager/cert-manager, the version controlplane/commands/cert-manager/go.mod pins) with its
controller, webhook and cainjector built here by scripts/build-cert-manager.sh, each an image FROM scratch
that the nodes import into containerd (`NodeCluster(..., images=[..., *images().values()])`)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from devtools.builds import image
from devtools.builds.binaries import binaries as controlplane_binaries
from devtools.clusters import helm_release
from devtools.clusters.helm_release import helm
from devtools.clusters.nodes import NodeCluster
from devtools.paths import REPO_ROOT
from devtools.waiting import until

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-cert-manager.sh"
MODULE_DIR = REPO_ROOT / "controlplane" / "commands" / "cert-manager"
MODULE = "github.com/cert-manager/cert-manager"
COMPONENTS = ("controller", "webhook", "cainjector")
NAMESPACE = "cert-manager"
RELEASE = "cert-manager"
LOG_TAIL_LINES = 40


class CertManagerError(RuntimeError):
    """cert-manager could not be built, packaged or installed; the message carries the relevant output."""


def version() -> str:
    """The cert-manager version controlplane/commands/cert-manager/go.mod requires (v1.21.2)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)} (v\S+)$", (MODULE_DIR / "go.mod").read_text(), re.M)
    if not match:
        raise CertManagerError(f"{MODULE_DIR / 'go.mod'} requires no {MODULE}")
    return match[1]


def binaries() -> Path:
    """The directory with the controller, webhook and cainjector binaries, built once by the build script into
    a cache keyed by version, Go version and our sources (progress to our stderr)."""
    proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    for line in proc.stderr:  # stdout carries one line only, so reading it afterwards cannot block
        tail.append(line)
        with contextlib.suppress(OSError):
            sys.stderr.write(line)
            sys.stderr.flush()
    out = proc.stdout.read().strip()
    if proc.wait() != 0 or not out:
        raise CertManagerError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}:\n{''.join(tail)}")
    path = Path(out.splitlines()[-1])
    missing = [c for c in COMPONENTS if not (path / c).is_file()]
    if missing:
        raise CertManagerError(f"{BUILD_SCRIPT} names {path}, which lacks {', '.join(missing)}")
    return path


def images() -> dict[str, str]:
    """Each component's image, by component: its binary alone FROM scratch, run as 1000:1000 (numeric, so the
    chart's runAsNonRoot holds), named `localhost/hami-mt-cert-manager-<component>:<version>-<12 hex of the
    binary's sha256>` and built only when podman lacks it."""
    bin_dir, v = binaries(), version()
    found = {}
    for component in COMPONENTS:
        binary = bin_dir / component
        digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12]
        name = f"localhost/hami-mt-cert-manager-{component}:{v}-{digest}"
        found[component] = image.from_scratch(name, binary, f"/app/{component}", "1000:1000")
    return found


def chart() -> Path:
    """cert-manager's Helm chart as a package (`cert-manager-<version>.tgz`, kept beside the binaries): the
    module's deploy/charts/cert-manager, copied out of the read-only module cache, with version and
    appVersion set as cert-manager's release sets them."""
    v = version()
    tgz = binaries() / f"cert-manager-{v}.tgz"
    if tgz.is_file():
        return tgz
    done = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{v}"], cwd=MODULE_DIR,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise CertManagerError(f"go mod download {MODULE}@{v} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    source = Path(json.loads(done.stdout)["Dir"]) / "deploy" / "charts" / "cert-manager"
    helm_bin = controlplane_binaries() / "helm"
    with tempfile.TemporaryDirectory(prefix="hami-mt-cert-manager-chart-") as tmp:
        copy = Path(tmp) / "cert-manager"
        shutil.copytree(source, copy, copy_function=shutil.copyfile)  # not the module cache's read-only modes
        packaged = subprocess.run([str(helm_bin), "package", str(copy), "--version", v, "--app-version", v,
                                   "--destination", tmp], capture_output=True, text=True, timeout=120)
        if packaged.returncode != 0:
            raise CertManagerError(f"helm package failed: {packaged.stderr.strip()}")
        shutil.move(Path(tmp) / f"cert-manager-{v}.tgz", f"{tgz}.tmp")
    Path(f"{tgz}.tmp").replace(tgz)
    return tgz


def install(cluster: NodeCluster, timeout: float = 180, values: tuple[str, ...] = ()) -> float:
    """cert-manager installed on `cluster` with its chart (CRDs included, no startupapicheck Job: the wait
    below does its check), the images built here imported on the nodes beforehand; waits until its three
    Deployments are Available and its webhook answers (a server-side dry-run of an Issuer is admitted).
    Returns the seconds from `helm install` to then. `values` are more `--set`s for cert-manager's chart."""
    names = images()
    started = time.monotonic()
    settings = ["crds.enabled=true", "startupapicheck.enabled=false", *values]
    for component, key in (("controller", ""), ("webhook", "webhook."), ("cainjector", "cainjector.")):
        repository, tag = names[component].rsplit(":", 1)
        settings += [f"{key}image.repository={repository}", f"{key}image.tag={tag}",
                     f"{key}image.pullPolicy=Never"]
    helm(cluster.controlplane, "install", RELEASE, str(chart()), "-n", NAMESPACE, "--create-namespace",
         *(a for v in settings for a in ("--set", v)))
    issuer = ("apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: probe, namespace: default}\n"
              "spec: {selfSigned: {}}\n")
    waiting_for = "the Deployments"

    def ready() -> bool:
        nonlocal waiting_for
        available = cluster.kubectl("wait", "deployment", "--all", "-n", NAMESPACE, "--for=condition=Available",
                                    "--timeout=1s", check=False)
        if available.returncode != 0:
            return False
        waiting_for = "the webhook"
        return cluster.kubectl("create", "--dry-run=server", "-f", "-", input=issuer, check=False).returncode == 0

    def not_ready(_: str) -> CertManagerError:
        pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
        events = cluster.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout[-4000:]
        return CertManagerError(f"cert-manager not ready {timeout:.0f} s after helm install (waiting for "
                                f"{waiting_for}):\n{pods}\n{events}")

    # the deadline counts from `helm install`, as the figure returned does
    until("cert-manager ready", ready, started + timeout - time.monotonic(), 0.5, fail=not_ready)
    return time.monotonic() - started


@contextlib.contextmanager
def cluster_with_chart(version: str | None = None, nodes: int = 1,
                       cert_manager: tuple[str, ...] = ()) -> Iterator[NodeCluster]:
    """`nodes` real nodes with cert-manager installed by its chart, then this webhook's chart with
    `certManager.enabled=true`, its 3 replicas Ready on the certificate cert-manager issued."""
    cluster = NodeCluster(nodes, version=version, images=[image.reference(), *images().values()])
    try:
        cluster.start()
        install(cluster, values=cert_manager)
        helm_release.install(cluster, values=["certManager.enabled=true"])
        yield cluster
    finally:
        cluster.stop()
