"""The one API client: which resource a call is counted under, when an answer is asked again (client-go's
rule), and that the watches and failover's writes keep to it. kube-apiserver cannot be made to answer 429 on
cue, so a loopback server does here; the calls themselves run against a real API server in the e2e tier."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import kopf
import pytest
from aiohttp import web

from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.service.failover.peers import Failover, Peers
from hami_mt_webhook.service.failover.peerview import Replica, Verdict
from hami_mt_webhook.service.kube.client import RETRY_AFTER_MAX, Api, ApiError, resource, retry_after
from hami_mt_webhook.service.kube.watch import Feed, Watch
from hami_mt_webhook.service.state import State


def test_requests_are_counted_by_the_resource_they_name() -> None:
    assert resource("/api/v1/pods") == "pods"
    assert resource("/api/v1/namespaces") == "namespaces"
    assert resource("/api/v1/namespaces/team/events") == "events"
    assert resource("/apis/apps/v1/deployments") == "deployments"
    assert resource("/apis/wgpolicyk8s.io/v1alpha2/namespaces/team/policyreports/hami-mt-webhook") == "policyreports"
    assert resource("/apis/coordination.k8s.io/v1/namespaces/ns/leases/hami-mt-webhook-audit") == "leases"
    assert resource("/apis/wgpolicyk8s.io/v1alpha2/clusterpolicyreports") == "clusterpolicyreports"


def test_an_answer_is_asked_again_only_when_the_server_says_when() -> None:
    assert retry_after(429, "1") == 1.0
    assert retry_after(503, "2") == 2.0
    assert retry_after(429, "3600") == RETRY_AFTER_MAX  # never minutes on a server's word
    assert retry_after(429, None) is None              # no Retry-After: final, as in client-go
    assert retry_after(404, "1") is None
    assert retry_after(409, "1") is None
    assert retry_after(429, "Wed, 21 Oct 2026 07:28:00 GMT") is None


async def answering(statuses: list[tuple[int, dict[str, str]]]) -> tuple[web.AppRunner, str, list[str]]:
    """A loopback server answering each request with the next of `statuses`, the last one thereafter."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        status, headers = statuses[min(len(seen), len(statuses) - 1)]
        seen.append(request.method)
        return web.json_response({"kind": "Status", "code": status}, status=status, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}", seen


async def test_a_429_with_retry_after_is_asked_again_and_each_try_is_counted() -> None:
    counted: list[tuple[str, str]] = []
    runner, server, seen = await answering([(429, {"Retry-After": "0"}), (429, {"Retry-After": "0"}), (200, {})])
    try:
        async with aiohttp.ClientSession() as client:
            status, body = await Api(client, server, lambda v, r: counted.append((v, r))).call(
                "GET", "/apis/wgpolicyk8s.io/v1alpha2/policyreports")
    finally:
        await runner.cleanup()
    assert (status, body["code"]) == (200, 200)
    assert seen == ["GET"] * 3
    assert counted == [("GET", "policyreports")] * 3


async def test_a_429_without_retry_after_or_past_the_retries_is_an_error() -> None:
    runner, server, seen = await answering([(429, {})])
    try:
        async with aiohttp.ClientSession() as client:
            with pytest.raises(ApiError, match="HTTP 429"):
                await Api(client, server, lambda v, r: None).call("GET", "/api/v1/namespaces")
            assert seen == ["GET"]
            seen.clear()
            await runner.cleanup()
            runner, server, seen = await answering([(429, {"Retry-After": "0"})])
            with pytest.raises(ApiError, match="HTTP 429"):
                await Api(client, server, lambda v, r: None).call("PUT", "/x", {}, retries=2)
            assert seen == ["PUT"] * 3
    finally:
        await runner.cleanup()


async def watch_reconnects(headers: dict[str, str]) -> float:
    """Seconds between a watch's first two requests when each is refused with 429 and `headers`."""
    asked: list[float] = []

    async def refuse(request: web.Request) -> web.Response:
        asked.append(time.monotonic())
        return web.json_response({"kind": "Status", "code": 429}, status=429, headers=headers)

    app = web.Application()
    app.router.add_get("/api/v1/nodes", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server = f"http://127.0.0.1:{runner.addresses[0][1]}"
    watch = Watch(Feed(), lambda: kopf.ConnectionInfo(server=server), path="/api/v1/nodes", what="node watch",
                  mode="stream")
    task = asyncio.create_task(watch.run())
    try:
        while len(asked) < 2:
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.cleanup()
    return asked[1] - asked[0]


async def test_a_watch_refused_with_retry_after_reconnects_after_the_wait_the_server_asked_for() -> None:
    assert await watch_reconnects({"Retry-After": "1"}) >= 0.75   # 1 s, less the jitter of 20 %
    assert await watch_reconnects({}) < 0.5                        # its own backoff: 0.2 s, jittered


async def test_a_verdict_is_written_once_through_the_client_and_a_refused_one_left_to_the_next_round() -> None:
    """Failover's status write is a strategic-merge PATCH through `Api`, not asked again on the server's word
    (the next round judges afresh); a refused one is a warning and a fresh session, not an error."""
    asked: list[tuple[str, str, str]] = []
    answers = [(500, {"Retry-After": "0"}), (200, {})]

    async def patch(request: web.Request) -> web.Response:
        asked.append((request.method, request.path, request.content_type))
        status, headers = answers[min(len(asked), len(answers)) - 1]
        return web.json_response({}, status=status, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", patch)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server = f"http://127.0.0.1:{runner.addresses[0][1]}"
    peers = Peers(State(Config(), ClusterView(ready=False)), lambda: kopf.ConnectionInfo(server=server),
                  Failover(me="a", namespace="ns", selector="app=x"), port=0, mode="list")
    target = Replica("b", "127.0.0.1", ready=True, answering=True)
    verdict = Verdict("b", False, 2, 3, "not heard for 1.0 s")
    try:
        first = peers._client()
        assert await peers._patch(verdict, target) is False
        assert peers._api is None or peers._api is not first  # the failed session dropped
        assert await peers._patch(verdict, target) is True
    finally:
        if peers._api is not None:
            await peers._api.close()
        await runner.cleanup()
    patch_type = "application/strategic-merge-patch+json"
    assert asked == [("PATCH", "/api/v1/namespaces/ns/pods/b/status", patch_type)] * 2
