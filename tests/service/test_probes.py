"""/readyz: ready only when the node view is synced and the webhook port listens; not while draining."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.service.probes import health_app
from hami_mt_webhook.service.state import State
from tests.builders import nodes_view


async def readyz(client: TestClient) -> tuple[int, str]:
    resp = await client.get("/readyz")
    return resp.status, await resp.text()


async def test_ready_needs_the_view_and_the_listener(serve_webhook) -> None:
    state = State(Config(), ClusterView(ready=False))
    async with TestClient(TestServer(health_app(state))) as client:
        assert await readyz(client) == (503, "not ready: the node view is not synced yet\n")
        state.view.replace({node.name: node for node in nodes_view()})
        state.view.ready = True  # as the node feed sets it once the set is complete
        # The view is synced before kopf has started the webhook server: still not ready.
        assert await readyz(client) == (503, "not ready: the webhook port is not listening\n")
        async with serve_webhook(state) as running:
            assert await readyz(client) == (200, "ready: 2 sliced nodes\n")
            async with aiohttp.ClientSession() as plain:  # the port really answers by now
                try:
                    await plain.get(f"http://127.0.0.1:{running.port}/")
                except aiohttp.ClientError:
                    pass  # TLS expected; the connection was accepted, which is all this checks
        # Stopped (drained): out of the Service's endpoints again.
        await asyncio.sleep(0)
        assert await readyz(client) == (503, "not ready: the webhook port is not listening\n")


async def test_livez_does_not_depend_on_readiness() -> None:
    state = State(Config(), ClusterView(ready=False))
    async with TestClient(TestServer(health_app(state))) as client:
        resp = await client.get("/livez")
        assert resp.status == 200 and await resp.text() == "ok\n"
