"""The node tier: the chart on a real kubelet, containerd and CNI, in a namespace of their own.

It needs root, containerd, runc, the CNI plugins (`make node-tools`), kubelet (built with the control
plane) and the image (`make image`), and minutes, so it runs only when asked: `pytest -m node`
(`make test-node`); any other run, `-m e2e` and `-m "not e2e"` included, leaves it out. One node serves
the session. What it measured is printed at the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devtools import paths
from devtools.builds import image
from devtools.builds.binaries import ControlPlaneError, pinned_versions
from devtools.clusters import helm_release
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread, creating
from devtools.release import previous
from tests.tiers import Tier

from .replicas import failover, failover_working, replicas, rolled_out, wait_for

TIER = Tier("node", __file__, "node tier")
MEASURED = TIER.measured
pytest_collection_modifyitems, pytest_terminal_summary = TIER.hooks()
NAMESPACE = helm_release.NAMESPACE
RATE = 20  # slice pods created per second under every change of the chart's Deployment
#: Long enough for a rollout of 3 replicas (each with its 5 s preStop) and failover's settling after it.
UPGRADE_SECONDS = 60
#: The values the install and every upgrade give (`helm_release.install`'s own: the image built here).
USER_VALUES = ("--set", f"image.repository={helm_release.NODE_IMAGE_REPOSITORY}")


@pytest.fixture(scope="session")
def node() -> Iterator[NodeCluster]:
    started = time.monotonic()
    n = NodeCluster(1, images=[image.reference(), previous.RELEASE.image])  # this tree's, and what it upgrades from
    try:
        previous.build(previous.RELEASE)  # kept from `make previous`: a lookup
        n.start()
    except (ControlPlaneError, RuntimeError) as e:
        pytest.fail(f"the node did not start:\n{e}", pytrace=False)
    MEASURED.append(f"node {n.controlplane.git_version} Ready {n.kubelet_ready_seconds:.1f} s after kubelet "
                    f"started, {n.startup_seconds:.1f} s after the start (control plane and image import "
                    "included)")
    try:
        yield n
    finally:
        n.stop()
        MEASURED.append(f"tier session {time.monotonic() - started:.0f} s from the node's start to its teardown")


@pytest.fixture(scope="session")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@dataclass(frozen=True)
class Upgrade:
    """What `helm upgrade` from the previous release did under traffic (`chart`; test_uptime judges it)."""

    total: int
    failures: list[str]
    created: int
    images: list[str]
    failover: dict[str, Any]
    seconds: float


#: The chart fixture's upgrade, once it ran.
UPGRADES: list[Upgrade] = []


def upgrades_run(node: NodeCluster) -> bool:
    """The upgrades from the previous release (the chart's and the kustomize base's, about 2.5 minutes of the
    tier) run on the newest Kubernetes only: the floor's run of the tier installs this tree's chart, which
    keeps `make test` inside CI's 90 minutes."""
    return node.controlplane.git_version == pinned_versions()[-1]


@pytest.fixture(scope="session")
def chart(node: NodeCluster, lt: LoopThread) -> Iterator[NodeCluster]:
    """The previous release's chart and image (`devtools.release.previous`) installed as the README's Install section
    says (`devtools.clusters.helm_release.install`, what `make run NODE=1` runs too), then `helm
    upgrade` to this tree's chart with the values it was installed with while RATE slice pods a second are created:
    the upgraded release is what every module of the tier works on, 3 replicas Ready through their probes. The
    upgrade's outcome is recorded in UPGRADES, not judged here, so one refused pod fails one test. On the floor
    (`upgrades_run`), this tree's chart installed directly."""
    rel = previous.RELEASE
    upgrading = upgrades_run(node)
    try:
        seconds = helm_release.install(node, chart=[str(rel.chart), *USER_VALUES, "--set",
                                                           f"image.tag={rel.tag}"] if upgrading else None)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    if not upgrading:
        MEASURED.append(f"helm install to 3 replicas Ready: {seconds:.1f} s")
        yield node
        return
    MEASURED.append(f"helm install of {rel.version} to 3 replicas Ready: {seconds:.1f} s")
    started = time.monotonic()
    with creating(node.controlplane, lt, "load-upgrade", RATE, UPGRADE_SECONDS) as creator:
        time.sleep(3)
        helm_release.helm(node.controlplane, "upgrade", helm_release.RELEASE, str(paths.CHART), "-n", NAMESPACE,
                          *USER_VALUES)
        rolled_out(node)
        took = time.monotonic() - started - 3
        wait_for("failover: every replica gated and hearing the others", lambda: failover_working(node), 60)
    images = sorted({c["image"] for p in replicas(node, terminating=True) for c in p["spec"]["containers"]})
    UPGRADES.append(Upgrade(int(RATE * UPGRADE_SECONDS), creator.failures, creator.results[201], images,
                            failover(node), took))
    MEASURED.append(f"helm upgrade from {rel.version} under {RATE} pods/s: {creator.results[201]}/"
                    f"{int(RATE * UPGRADE_SECONDS)} created, {len(creator.failures)} failed; rolled out in "
                    f"{took:.0f} s; the fixture {time.monotonic() - started:.0f} s more than a plain install")
    yield node
