"""The quota feed: ResourceQuota watch events in, the namespace index out (SPEC.md §4.9).

The lines are those kube-apiserver writes for a WatchList request; tests/e2e/test_controllers.py
watches a real one.
"""

from __future__ import annotations

import orjson
import pytest

from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.quota import QuotaIndex
from hami_mt_webhook.service.kube.watch import INITIAL_EVENTS_END, Expired
from hami_mt_webhook.service.watches.quotawatch import QuotaFeed

MEMORY = "mthreads.com/sgpu-memory"


def quota(namespace: str, name: str, **hard: str) -> dict:
    return {"kind": "ResourceQuota", "metadata": {"namespace": namespace, "name": name, "resourceVersion": "5"},
            "spec": {"hard": hard}}


def event(kind: str, obj: dict) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


def end(rv: str) -> bytes:
    return event("BOOKMARK", {"metadata": {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}})


LIMITED = {f"limits.{MEMORY}": "320"}
REQUESTED = {f"requests.{MEMORY}": "320"}


@pytest.fixture
def feed() -> QuotaFeed:
    return QuotaFeed(QuotaIndex(), Config())


def test_initial_set_is_applied_whole_at_the_end_bookmark(feed):
    feed.start_build()
    feed.line(event("ADDED", quota("a", "hami", **LIMITED)))
    feed.line(event("ADDED", quota("b", "k8s", **REQUESTED)))
    assert not feed.index.ready and len(feed.index) == 0
    feed.line(end("9"))
    assert feed.index.ready and feed.resource_version == "9"
    assert dict(feed.index.get("a")) == {"hami": frozenset({f"limits.{MEMORY}"})}
    assert feed.index.get("b") == {}  # requests. keys are enforced: nothing kept


def test_changes_after_the_sync_apply_at_once(feed):
    feed.start_build()
    feed.line(end("1"))
    feed.line(event("ADDED", quota("a", "hami", **LIMITED)))
    assert set(feed.index.get("a")) == {"hami"}
    feed.line(event("MODIFIED", quota("a", "hami", **REQUESTED)))  # converted as docs/migration.md shows
    assert feed.index.get("a") == {}
    feed.line(event("ADDED", quota("a", "hami", **LIMITED)))
    feed.line(event("DELETED", quota("a", "hami", **LIMITED)))
    assert feed.index.get("a") == {}


def test_a_rebuild_drops_quotas_deleted_while_away(feed):
    feed.start_build()
    feed.line(event("ADDED", quota("a", "gone", **LIMITED)))
    feed.line(end("1"))
    feed.start_build()
    feed.line(event("ADDED", quota("b", "kept", **LIMITED)))
    assert set(feed.index.get("a")) == {"gone"}  # the old index answers until the new set is complete
    feed.line(end("2"))
    assert feed.index.get("a") == {} and set(feed.index.get("b")) == {"kept"}


def test_a_410_asks_for_a_fresh_set(feed):
    with pytest.raises(Expired):
        feed.line(event("ERROR", {"code": 410, "message": "too old resource version"}))
