"""End-to-end tests against a real etcd + kube-apiserver on loopback.

One control plane serves the whole session: a start costs seconds, and tests keep apart by using
their own object names. If the binaries cannot be built the tests fail rather than skip, so a broken
toolchain is never mistaken for a green run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.builds import wheel
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import apply_nodes, example_nodes
from devtools.clusters.local import LocalWebhook

from .support import RETIRED, TAINT, running, serving_from_wheel

E2E_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark everything under tests/e2e, so `-m "not e2e"` gives a quick run without a cluster."""
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def installed() -> Iterator[wheel.Installed]:
    """The wheel built from this tree, installed with its dependencies into a fresh virtualenv outside it
    (one per state of the sources, see `wheel.install_cached`).

    Every webhook the e2e tier starts runs `serve` from here, the command users run."""
    with serving_from_wheel() as done:
        yield done


@pytest.fixture(scope="session")
def controlplane(installed: wheel.Installed) -> Iterator[ControlPlane]:
    # started once: every module shares its controllers and scheduler
    with running(ControlPlane(controllers=True)) as cp:
        yield cp


@pytest.fixture(scope="session")
def webhook(controlplane: ControlPlane) -> Iterator[LocalWebhook]:
    """`hami-mt-webhook serve` in its own process, registered through the manifests' local overlay,
    logged in as the shipped ServiceAccount, with the example S4000 and S5000 nodes and a whole-card node,
    one retired scheduler name, and the opt-in sliced-node taint."""
    hook = LocalWebhook(controlplane, controlplane.workdir / "webhook", extra_args=["--retired-schedulers", RETIRED,
                                                                            "--sliced-node-taint", TAINT])
    hook.install()
    apply_nodes(controlplane, example_nodes())
    hook.start()
    try:
        yield hook
    finally:
        hook.stop()
