"""The probe and metrics endpoints, on their own plain-HTTP listener."""

from __future__ import annotations

import aiohttp.web

from .state import State

__all__ = ["health_app"]


def health_app(state: State) -> aiohttp.web.Application:
    """/readyz is ready once the node view has been synced (and stays so while the watch reconnects: see
    `nodewatch`) and the webhook port listens; kopf starts the server after the view may already be synced,
    and a draining server must leave the Service's endpoints. /livez only says the event loop answers;
    /metrics is Prometheus text."""

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        if not state.view.ready:
            return aiohttp.web.Response(status=503, text="not ready: the node view is not synced yet\n")
        if not state.serving:
            return aiohttp.web.Response(status=503, text="not ready: the webhook port is not listening\n")
        return aiohttp.web.Response(text=f"ready: {len(state.view)} sliced nodes\n")

    async def livez(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok\n")

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=state.metrics.render(),
                                    headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = aiohttp.web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", metrics)
    return app
