"""Shared fixtures: settings, a two-model node view, pod builders, certificates, a running webhook and the
kustomize base's documents."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from devtools.clusters import manifests
from devtools.clusters.local import LOCAL_SANS
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.service import certs
from hami_mt_webhook.service.serving import server
from hami_mt_webhook.service.serving.connections import Limits
from hami_mt_webhook.service.state import State
from tests.builders import make_pod as _make_pod
from tests.builders import nodes_view as _nodes_view


@pytest.fixture
def config() -> Config:
    return Config()


@pytest.fixture
def nodes_view() -> ClusterView:
    """One S4000 node (1 card, 96 units per card) and one S5000 node (8 cards, 160 per card)."""
    return _nodes_view()


@pytest.fixture
def make_pod() -> Callable[..., dict[str, Any]]:
    """builders.make_pod: a Pod as the API server presents it to admission."""
    return _make_pod


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    """The kustomize base's documents (devtools.clusters.manifests.load), in its order: for the tests of manifests/,
    devtools.clusters.manifests and admission.configurations."""
    return manifests.load()


@pytest.fixture
def certs_dir(tmp_path: Path) -> certs.Layout:
    """A CA and a serving certificate (SANs include 127.0.0.1) in a fresh directory."""
    dns, ips = certs.split_sans(LOCAL_SANS)
    return certs.ensure(tmp_path / "certs", extra_dns=dns, ips=ips)


@dataclass
class Running:
    """A webhook server on loopback; unpacks as (url, ca_path, state)."""

    url: str
    ca_path: Path
    state: State
    server: server.AdmissionServer
    layout: certs.Layout
    port: int

    def __iter__(self):
        return iter((self.url, self.ca_path, self.state))


@pytest.fixture
def serve_webhook(certs_dir: certs.Layout, nodes_view: ClusterView):
    """An async context manager factory: start an AdmissionServer the way kopf drives it."""

    @contextlib.asynccontextmanager
    async def start(state: State | None = None, **options: Any) -> AsyncIterator[Running]:
        state = state or State(Config(), nodes_view)
        options.setdefault("reload_interval", 3600.0)
        options.setdefault("limits", Limits(drain_seconds=0.2, shutdown_timeout=0.5))
        srv = server.AdmissionServer(state, addr="127.0.0.1", port=0, certfile=str(certs_dir.tls_cert),
                                     pkeyfile=str(certs_dir.tls_key), **options)
        gen = cast(AsyncGenerator[Any, None], srv(None))  # AdmissionServer.__call__ is an async generator
        configs: asyncio.Queue = asyncio.Queue()

        async def drive() -> None:  # kopf iterates the server for as long as the operator runs
            async for cfg in gen:
                await configs.put(cfg)

        task = asyncio.create_task(drive())
        try:
            getter = asyncio.ensure_future(configs.get())
            done, _ = await asyncio.wait({getter, task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                if task.done():
                    task.result()  # raise what stopped the server
                raise TimeoutError("the webhook server did not start")
            cfg = getter.result()
            port = srv.port  # the port the kernel gave
            assert port and cfg["url"] == f"https://127.0.0.1:{port}"
            yield Running(cfg["url"], certs_dir.ca_cert, state, srv, certs_dir, port)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await gen.aclose()

    return start


@pytest.fixture
async def webhook_server(serve_webhook) -> AsyncIterator[Running]:
    """The webhook on 127.0.0.1 with the S4000/S5000 view; yields (url, ca_path, state)."""
    async with serve_webhook() as running:
        yield running


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """A run ended by SIGTERM or a closed terminal (SIGHUP) unwinds like Ctrl-C: session fixtures stop the
    webhook and the control plane, and their work dirs are removed. (SIGKILL cannot be caught; the children
    then die with the run through PR_SET_PDEATHSIG, and only the work dir is left.)"""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from tests.builders import CASES

    if CASES:
        terminalreporter.section("hypothesis cases run")
        for test, n in sorted(CASES.items()):
            terminalreporter.write_line(f"{test}: {n}")
        terminalreporter.write_line(f"total: {sum(CASES.values())}")
