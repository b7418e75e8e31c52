"""The audit loop's pure parts: how often an Event may be sent, how requests are counted, what an Event says,
when an answer is asked again; its reads, writes and Lease run against a real API server in
tests/e2e/test_audit.py (which cannot make kube-apiserver answer 429 on cue: a loopback server does here)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from hami_mt_webhook.audit.findings import FAIL, WARN, Result
from hami_mt_webhook.audit.objects import Subject
from hami_mt_webhook.service.audit import (
    FULL_COLLECTIONS_RARER,
    RETRY_AFTER_MAX,
    Api,
    ApiError,
    EventLimit,
    _event,
    _rare_full_collections,
    _renewing,
    _resource,
    _retry_after,
)
from hami_mt_webhook.service.metrics import Metrics


def finding(name: str, message: str = "too many cores", outcome: str = FAIL) -> Result:
    return Result("range", Subject("apps/v1", "Deployment", "team", name, f"uid-{name}"), outcome, message)


def test_the_same_finding_on_the_same_workload_is_sent_once_per_period() -> None:
    limit = EventLimit(every=3600, per_pass=20)
    assert limit.due([finding("a"), finding("b")], now=0) == [finding("a"), finding("b")]
    assert limit.due([finding("a"), finding("b")], now=60) == []           # a retry loop sends nothing more
    assert limit.due([finding("a", "another message")], now=61) == [finding("a", "another message")]
    assert limit.due([finding("a")], now=3601) == [finding("a")]          # a period later, once again


def test_a_pass_sends_at_most_so_many_events() -> None:
    limit = EventLimit(every=3600, per_pass=3)
    many = [finding(f"w{i}") for i in range(10)]
    assert len(limit.due(many, now=0)) == 3
    assert len(limit.due(many, now=1)) == 3  # the rest come in the next passes


def test_requests_are_counted_by_the_resource_they_name() -> None:
    assert _resource("/api/v1/pods") == "pods"
    assert _resource("/api/v1/namespaces") == "namespaces"
    assert _resource("/api/v1/namespaces/team/events") == "events"
    assert _resource("/apis/apps/v1/deployments") == "deployments"
    assert _resource("/apis/wgpolicyk8s.io/v1alpha2/namespaces/team/policyreports/hami-mt-webhook") == "policyreports"
    assert _resource("/apis/coordination.k8s.io/v1/namespaces/ns/leases/hami-mt-webhook-audit") == "leases"
    assert _resource("/apis/wgpolicyk8s.io/v1alpha2/clusterpolicyreports") == "clusterpolicyreports"


def test_an_event_names_the_workload_and_says_deny_or_would_deny() -> None:
    event = _event(finding("train", outcome=WARN), "replica-0")
    assert event["involvedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team",
                                       "name": "train", "uid": "uid-train"}
    assert (event["type"], event["reason"]) == ("Warning", "PodsWouldBeDenied")
    assert event["message"] == "hami-mt-webhook audit: too many cores"
    assert event["metadata"] == {"generateName": "train.", "namespace": "team"}
    assert _event(finding("train"), "replica-0")["reason"] == "PodsDenied"
    assert len(_event(finding("x", "m" * 5000), "r")["message"]) < 1100  # clipped, and says how long it was


def test_a_fixed_violation_leaves_the_metrics_and_so_does_a_replica_that_stops_auditing() -> None:
    metrics = Metrics()
    metrics.audit_done({("range", "team"): 2, ("slice-pods", "old"): 1}, 3.5)
    text = metrics.render().decode()
    assert 'hami_mt_webhook_audit_violations{namespace="team",rule="range"} 2.0' in text
    metrics.audit_done({("range", "team"): 1}, 2.0)
    text = metrics.render().decode()
    assert 'rule="slice-pods"' not in text and "hami_mt_webhook_audit_duration_seconds 2.0" in text
    metrics.audit_lost()
    assert "hami_mt_webhook_audit_violations{" not in metrics.render().decode()


def test_full_collections_are_rarer_during_a_pass_and_the_thresholds_come_back_after_it() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), _rare_full_collections():
        assert gc.get_threshold() == (*before[:2], before[2] * FULL_COLLECTIONS_RARER)  # the young ones as they were
        raise RuntimeError("a pass that fails")
    assert gc.get_threshold() == before


def test_an_answer_is_asked_again_only_when_the_server_says_when() -> None:
    assert _retry_after(429, "1") == 1.0
    assert _retry_after(503, "2") == 2.0
    assert _retry_after(429, "3600") == RETRY_AFTER_MAX  # never minutes on a server's word
    assert _retry_after(429, None) is None              # no Retry-After: final, as in client-go
    assert _retry_after(404, "1") is None
    assert _retry_after(409, "1") is None
    assert _retry_after(429, "Wed, 21 Oct 2026 07:28:00 GMT") is None


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


#: Renewals every 50 ms of a Lease of 150 ms: one failed renewal is tried again, a second in a row is too late.
RENEW, LEASE = 0.05, 0.15


def renewals(*answers: bool | Exception) -> tuple[list[bool | Exception], Callable[[], Awaitable[bool]]]:
    """A Lease's renewals answering `answers` in turn (an error raised, or whether it is still held), then held."""
    asked: list[bool | Exception] = []

    async def hold() -> bool:
        answer = answers[len(asked)] if len(asked) < len(answers) else True
        asked.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return asked, hold


async def test_a_pass_renewed_beside_ends_as_it_ends() -> None:
    asked, hold = renewals()
    work = asyncio.ensure_future(asyncio.sleep(0.3, "published"))
    assert await _renewing(work, hold, RENEW, LEASE) is True
    assert work.result() == "published" and len(asked) >= 3


async def test_a_lost_lease_cancels_the_pass() -> None:
    asked, hold = renewals(True, False)
    work = asyncio.ensure_future(asyncio.sleep(5))
    assert await _renewing(work, hold, RENEW, LEASE) is False
    assert work.cancelled() and asked == [True, False]


async def test_one_failed_renewal_is_tried_again_and_the_pass_goes_on() -> None:
    asked, hold = renewals(aiohttp.ClientConnectionError("reset"), True, TimeoutError(), True)
    work = asyncio.ensure_future(asyncio.sleep(0.4, "published"))
    assert await _renewing(work, hold, RENEW, LEASE) is True
    assert work.result() == "published" and len(asked) >= 4


async def test_renewals_failing_until_another_replica_may_take_over_stop_the_pass_before_it_writes() -> None:
    asked, hold = renewals(TimeoutError(), ApiError("GET /lease: 500 etcd leader changed", 500))
    work = asyncio.ensure_future(asyncio.sleep(5))
    with pytest.raises(ApiError):
        await _renewing(work, hold, RENEW, LEASE)
    assert work.cancelled() and len(asked) == 2


async def test_a_cancelled_auditor_leaves_no_pass_running() -> None:
    asked, hold = renewals()
    work = asyncio.ensure_future(asyncio.sleep(5))
    renewing = asyncio.ensure_future(_renewing(work, hold, RENEW, LEASE))
    await asyncio.sleep(0.12)
    renewing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await renewing
    assert work.cancelled()
