"""The audit loop's parts: how often an Event may be sent, what an Event says, how a pass is paced beside the
Lease's renewals; its reads, writes and Lease run against a real API server in tests/e2e/test_audit.py."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from hami_mt_webhook.audit.findings import FAIL, WARN, Result
from hami_mt_webhook.audit.objects import Subject
from hami_mt_webhook.service.auditor.events import EventLimit, event
from hami_mt_webhook.service.auditor.loop import FULL_COLLECTIONS_RARER, _rare_full_collections, _renewing
from hami_mt_webhook.service.kube.client import ApiError
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


def test_an_event_names_the_workload_and_says_deny_or_would_deny() -> None:
    sent = event(finding("train", outcome=WARN), "replica-0")
    assert sent["involvedObject"] == {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "team",
                                      "name": "train", "uid": "uid-train"}
    assert (sent["type"], sent["reason"]) == ("Warning", "PodsWouldBeDenied")
    assert sent["message"] == "hami-mt-webhook audit: too many cores"
    assert sent["metadata"] == {"generateName": "train.", "namespace": "team"}
    assert event(finding("train"), "replica-0")["reason"] == "PodsDenied"
    assert len(event(finding("x", "m" * 5000), "r")["message"]) < 1100  # clipped, and says how long it was


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
