"""The hami tier: pods the webhook admitted, placed by HAMi's own scheduler extender beside kube-scheduler.

HAMi is built from a HAMi source tree the developer fetched (`$HAMI_MT_HAMI_SOURCE`, `devtools.clusters.hami`) with
the tree's own go.mod, so the tier needs the tree, Go and cgo, and runs only when asked: `pytest -m hami`
(`make test-hami`); any other run leaves it out, and `-m hami` without the variable skips it, saying how to
fetch HAMi. Each module has its own control plane (kube-scheduler calling HAMi's extender as HAMi's chart
configures it), the webhook from the installed wheel, and Moore Threads nodes as the vendor's device plugin
reports them: HAMi reads nothing else of a node for Moore Threads (no handshake annotation, no node lock).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.builds import wheel
from devtools.clusters import hami
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.local import LocalWebhook
from tests.e2e.support import running, serving_from_wheel
from tests.tiers import only_when_selected

HAMI_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only_when_selected(config, items, "hami", HAMI_DIR)


@pytest.fixture(scope="session")
def hami_scheduler() -> Path:
    """HAMi's scheduler binary, built from `$HAMI_MT_HAMI_SOURCE` (cached; seconds once Go has built it).

    Without the variable the tier is skipped, with what to do; a tree that does not build fails it, so a
    broken toolchain is never mistaken for a green run."""
    if not os.environ.get(hami.SOURCE_ENV, "").strip():
        pytest.skip(f"the hami tier needs HAMi's sources: {hami.HOW}")
    try:
        return hami.build_scheduler(hami.tree())
    except hami.Missing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def installed(hami_scheduler: Path) -> Iterator[wheel.Installed]:
    """The wheel built from this tree in a fresh virtualenv, as the e2e tier runs the webhook."""
    with serving_from_wheel() as done:
        yield done


@pytest.fixture(scope="module")
def extender(hami_scheduler: Path) -> hami.SchedulerExtender:
    return hami.SchedulerExtender(hami_scheduler)


@pytest.fixture(scope="module")
def controlplane(installed: wheel.Installed, extender: hami.SchedulerExtender) -> Iterator[ControlPlane]:
    with running(ControlPlane(controllers=True, extender=extender),
                 "the local control plane with HAMi's extender") as cp:
        yield cp


def create_nodes(cp: ControlPlane, nodes: list[dict[str, Any]]) -> None:
    """Create Nodes with their capacity and allocatable in one request: HAMi reads a node's devices when it
    is added (and every 15 s), so the capacity must be there already."""
    for node in nodes:
        capacity = node["status"]["capacity"]
        obj = {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"],
               "status": {"capacity": capacity, "allocatable": capacity}}
        cp.kubectl("create", "-f", "-", input=yaml.safe_dump(obj))


def start_webhook(cp: ControlPlane, nodes: list[dict[str, Any]]) -> Iterator[LocalWebhook]:
    """The webhook from the shipped manifests' local overlay, started once `nodes` exist: ready means its
    node view has them, so it fills and snaps against their cards from the first pod."""
    hook = LocalWebhook(cp, cp.workdir / "webhook")
    hook.install()
    create_nodes(cp, nodes)
    hook.start()
    try:
        yield hook
    finally:
        hook.stop()
