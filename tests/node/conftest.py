"""The node tier: the chart on a real kubelet, containerd and CNI, in a namespace of their own.

It needs root, containerd, runc, the CNI plugins (`make node-tools`), kubelet (built with the control
plane) and the image (`make image`), and minutes, so it runs only when asked: `pytest -m node`
(`make test-node`); any other run, `-m e2e` and `-m "not e2e"` included, leaves it out. One node serves
the session. What it measured is printed at the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import local
from devtools.binaries import ControlPlaneError
from devtools.nodes import Cluster
from tests.tiers import only_when_selected, report_measured

NODE_DIR = Path(__file__).resolve().parent
NAMESPACE = local.NAMESPACE
#: Lines for the summary at the end of the run: what the tier measured.
MEASURED: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only_when_selected(config, items, "node", NODE_DIR)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report_measured(terminalreporter, "node tier", MEASURED)


@pytest.fixture(scope="session")
def node() -> Iterator[Cluster]:
    started = time.monotonic()
    n = Cluster(1)
    try:
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
def chart(node: Cluster) -> Iterator[Cluster]:
    """The chart installed as the README's Install section says (`devtools.local.install_chart_on_node`, what
    `make run NODE=1` runs too), 3 replicas Ready through their probes."""
    try:
        seconds = local.install_chart_on_node(node)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    MEASURED.append(f"helm install to 3 replicas Ready: {seconds:.1f} s")
    yield node
