"""The fault tier: three real nodes, the chart's replicas one per node, a replica or its node broken while
slice pods are created at 20 a second (`devtools.scenarios.faults`).

It needs what the node tier needs (root, `make node-tools`, the image) and about twenty minutes, so it runs
only when asked: `pytest -m faults` (`make test-faults`, `KUBE_VERSION` as for the other tiers). What it
measured is printed at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devtools.builds.binaries import ControlPlaneError
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread
from devtools.scenarios.faults import Faults, cluster_with_chart
from tests.tiers import Tier

TIER = Tier("faults", __file__, "fault tier")
MEASURED = TIER.measured
pytest_collection_modifyitems, pytest_terminal_summary = TIER.hooks()


@pytest.fixture(scope="session")
def cluster() -> Iterator[NodeCluster]:
    try:
        with cluster_with_chart(os.environ.get("HAMI_MT_KUBE_VERSION")) as c:
            MEASURED.append(f"Kubernetes {c.controlplane.git_version}: 3 nodes Ready {c.startup_seconds:.0f} s "
                            "after the start, the chart's replicas one per node")
            yield c
    except (ControlPlaneError, RuntimeError) as e:
        pytest.fail(f"the cluster did not start:\n{e}", pytrace=False)


@pytest.fixture(scope="session")
def faults(cluster: NodeCluster) -> Iterator[Faults]:
    lt = LoopThread()
    try:
        yield Faults(cluster, lt)
    finally:
        lt.close()
