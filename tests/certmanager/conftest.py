"""The cert-manager tier: cert-manager installed from its own Helm chart on one real node (kubelet,
containerd), its controller, webhook and cainjector built here from the Go module proxy as images FROM
scratch (`devtools.clusters.certmanager`), then this webhook's chart with its own CA, moved to
`certManager.enabled=true` on the live release, its certificate renewed and its root rotated, all under
slice-pod traffic (`devtools.scenarios.renewals`). Root and minutes, so it runs only when asked: `pytest -m certmanager`
(`make test-certmanager`, and in `make test`). What it measured is printed at the end of the run."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from devtools.builds import image
from devtools.builds.binaries import ControlPlaneError
from devtools.clusters import certmanager, helm_release
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread
from devtools.scenarios import renewals
from tests.tiers import Tier

TIER = Tier("certmanager", __file__, "certmanager tier")
MEASURED = TIER.measured
pytest_collection_modifyitems, pytest_terminal_summary = TIER.hooks()


@pytest.fixture(scope="session")
def cluster() -> Iterator[NodeCluster]:
    """One node with cert-manager's images in its containerd, and cert-manager installed by its chart."""
    started = time.monotonic()
    try:
        images = list(certmanager.images().values())
    except (certmanager.CertManagerError, RuntimeError) as e:
        pytest.fail(f"cert-manager's images could not be built:\n{e}", pytrace=False)
    MEASURED.append(f"images ({', '.join(images)}) ready in {time.monotonic() - started:.1f} s")
    n = NodeCluster(1, images=[image.reference(), *images])
    try:
        n.start()
    except (ControlPlaneError, RuntimeError) as e:
        pytest.fail(f"the node did not start:\n{e}", pytrace=False)
    MEASURED.append(f"node {n.controlplane.git_version} Ready {n.startup_seconds:.1f} s after the start")
    try:
        try:
            seconds = certmanager.install(n)
        except RuntimeError as e:
            pytest.fail(str(e), pytrace=False)
        MEASURED.append(f"helm install of cert-manager {certmanager.version()} to its Deployments Available and "
                        f"its webhook answering: {seconds:.1f} s")
        yield n
    finally:
        n.stop()
        MEASURED.append(f"tier session {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="session")
def moved(cluster: NodeCluster) -> renewals.Counted:
    """The chart installed with its own CA (certManager.enabled=false), then moved to cert-manager on the live
    release as docs/upgrading.md, "to cert-manager" says, under slice-pod traffic: what happened to each pod."""
    try:
        seconds = helm_release.install(cluster)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    MEASURED.append(f"helm install with the chart's own CA to 3 replicas Ready: {seconds:.1f} s")
    lt = LoopThread()
    try:
        counted = renewals.count_move_to_cert_manager(cluster, lt)
    except (renewals.RenewalError, RuntimeError) as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        lt.close()
    MEASURED.append(counted.line())
    MEASURED.extend(counted.steps)
    return counted


@pytest.fixture(scope="session")
def chart(cluster: NodeCluster, moved: renewals.Counted) -> NodeCluster:
    """The chart with `certManager.enabled=true`, reached from its own CA on the live release (`moved`):
    3 replicas serving the certificate cert-manager issued from the chart's root."""
    return cluster
