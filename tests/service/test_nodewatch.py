"""The node feed: watch events in, a complete view out (SPEC.md §2; the streaming list as the API sends it).

These drive `NodeFeed` with the lines kube-apiserver writes for a WatchList request; the same
requests against the real server are in tests/e2e/test_nodeview.py.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from devtools.load import fleet
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.service.kube import client, watch
from hami_mt_webhook.service.kube.watch import (
    CAUGHT_UP,
    INITIAL_EVENTS_END,
    LINES_PER_TURN,
    MAX_LINE,
    Expired,
    WatchError,
    batches,
)
from hami_mt_webhook.service.metrics import Metrics
from hami_mt_webhook.service.watches.nodefeed import NodeFeed
from tests.builders import S4000, S5000

CONFIG = Config()


def node(name: str, cards: int = 8, per_card: int = 160, rv: str = "1", **labels: str) -> dict:
    labels = {"kubernetes.io/hostname": name, **labels}
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels},
            "status": {"capacity": {"mthreads.com/sgpu-core": str(16 * cards),
                                    "mthreads.com/sgpu-memory": str(per_card * cards)}}}


def event(kind: str, obj: dict) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


def bookmark(rv: str, end: bool = False) -> bytes:
    meta: dict = {"resourceVersion": rv}
    if end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return event("BOOKMARK", {"kind": "Node", "metadata": meta})


def names(view: ClusterView) -> set[str]:
    return {n.name for n in view}


@pytest.fixture
def feed() -> NodeFeed:
    return NodeFeed(ClusterView(ready=False), CONFIG, Metrics())


def test_initial_events_are_invisible_until_the_end_bookmark(feed):
    feed.start_build()
    feed.line(event("ADDED", node("a", rv="10")))
    feed.line(event("ADDED", node("b", cards=1, per_card=96, rv="11")))
    feed.line(bookmark("11"))  # a bookmark without the annotation ends nothing
    assert not feed.view.ready and len(feed.view) == 0
    feed.line(bookmark("12", end=True))
    assert feed.view.ready and names(feed.view) == {"a", "b"}
    assert feed.resource_version == "12"
    assert feed.metrics.nodes._value.get() == 2


def test_a_rebuild_replaces_the_view_whole_and_the_old_one_answers_meanwhile(feed):
    feed.start_build()
    for name in ("a", "b", "c"):
        feed.line(event("ADDED", node(name)))
    feed.line(bookmark("5", end=True))
    feed.start_build()  # after a 410: the set is read again
    assert feed.resource_version is None
    feed.line(event("ADDED", node("a")))
    feed.line(event("ADDED", node("d", per_card=176)))
    assert names(feed.view) == {"a", "b", "c"}  # still the old set while the new one arrives
    feed.line(bookmark("9", end=True))
    assert names(feed.view) == {"a", "d"}  # b and c were deleted while disconnected: gone
    assert feed.view.candidates({}, CONFIG).capacities == {160, 176}


def test_events_after_the_sync_apply_in_place_and_move_the_resume_point(feed):
    feed.start_build()
    feed.line(event("ADDED", node("a")))
    feed.line(bookmark("5", end=True))
    feed.line(event("ADDED", node("b", rv="6")))
    feed.line(event("MODIFIED", node("a", per_card=96, rv="7")))
    assert feed.view.get("a").per_card == 96 and feed.resource_version == "7"
    feed.line(event("DELETED", node("b", rv="8")))
    assert names(feed.view) == {"a"} and feed.resource_version == "8"
    feed.line(bookmark("20"))
    assert feed.resource_version == "20"


def test_a_node_that_stops_reporting_slices_leaves_the_view(feed):
    feed.start_build()
    feed.line(event("ADDED", node("a")))
    feed.line(bookmark("5", end=True))
    plain = {"metadata": {"name": "a", "resourceVersion": "6"}, "status": {"capacity": {"cpu": "8"}}}
    feed.line(event("MODIFIED", plain))
    assert len(feed.view) == 0


def nonstandard(feed: NodeFeed) -> float:
    assert feed.metrics is not None
    value = feed.metrics.registry.get_sample_value("hami_mt_webhook_nonstandard_capacity_nodes")
    assert value is not None
    return value


def test_an_overcommitted_node_is_logged_once_and_counted(feed, caplog):
    """SPEC §2: 8 cards at overcommit_ratio 1.1 report 1408 units, 176 a card: used, logged once, counted."""
    caplog.set_level("WARNING", logger="hami_mt_webhook")
    feed.start_build()
    feed.line(event("ADDED", node("oc", per_card=176, rv="1")))
    feed.line(event("ADDED", node("plain", rv="2")))
    feed.line(bookmark("3", end=True))
    assert feed.view.get("oc").per_card == 176 and nonstandard(feed) == 1
    for rv in range(4, 10):  # status heartbeats and label changes: the same capacity, no new line
        feed.line(event("MODIFIED", node("oc", per_card=176, rv=str(rv), zone=str(rv))))
    feed.start_build()  # a relist after 410 Gone reads it again: still no new line
    feed.line(event("ADDED", node("oc", per_card=176, rv="20")))
    feed.line(event("ADDED", node("oc2", cards=4, per_card=192, rv="21")))
    feed.line(bookmark("22", end=True))
    logged = [r.getMessage() for r in caplog.records if "not a known card size" in r.getMessage()]
    assert [m.split(":")[0] for m in logged] == ["node oc", "node oc2"]
    assert "176 units of mthreads.com/sgpu-memory per sliced card" in logged[0]
    assert "overcommit_ratio" in logged[0]
    assert nonstandard(feed) == 2
    # A changed capacity is news; back to a card size, then deleted: the count follows.
    feed.line(event("MODIFIED", node("oc", per_card=192, rv="23")))
    feed.line(event("MODIFIED", node("oc2", cards=4, per_card=160, rv="24")))
    feed.line(event("DELETED", node("oc", per_card=192, rv="25")))
    assert len([r for r in caplog.records if "not a known card size" in r.getMessage()]) == 3
    assert nonstandard(feed) == 0 and len(feed.noted) == 0


def test_a_configured_memory_per_card_is_a_known_size(caplog):
    feed = NodeFeed(ClusterView(ready=False), Config(memory_per_card=(96, 176)), Metrics())
    feed.start_build()
    feed.line(event("ADDED", node("oc", per_card=176)))
    feed.line(bookmark("2", end=True))
    assert nonstandard(feed) == 0 and "not a known card size" not in caplog.text


def test_deletions_during_the_initial_events_are_applied_to_the_build(feed):
    feed.start_build()
    feed.line(event("ADDED", node("a")))
    feed.line(event("DELETED", node("a")))
    feed.line(event("ADDED", node("b")))
    feed.line(bookmark("3", end=True))
    assert names(feed.view) == {"b"}


def test_an_expired_resource_version_asks_for_a_new_set(feed):
    status = {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired",
              "message": "too old resource version: 5 (90)"}
    with pytest.raises(Expired, match="too old resource version"):
        feed.line(event("ERROR", status))


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"type": "ADDED"}', event("ERROR", {"code": 500})])
def test_unreadable_or_failed_events_raise_a_watch_error(feed, raw):
    with pytest.raises(WatchError):
        feed.line(raw)


def test_a_real_sized_node_is_kept_small(feed):
    feed.start_build()
    obj = fleet.node(0)
    feed.line(event("ADDED", obj))
    feed.line(bookmark("2", end=True))
    kept = feed.view.get(fleet.name_of(0))
    assert kept is not None and (kept.cards, kept.per_card) == (8, 160)
    assert kept.labels == obj["metadata"]["labels"]


def test_views_built_by_hand_still_match_the_builders():
    view = ClusterView([S4000, S5000])
    view.replace({S5000.name: S5000})
    assert names(view) == {S5000.name}
    assert view.candidates({}, CONFIG).capacities == {160}


def split_into(chunks: list[bytes]):
    async def collect() -> list[bytes]:
        reader = asyncio.StreamReader()
        for c in chunks:
            reader.feed_data(c)
        reader.feed_eof()

        class Content:  # aiohttp's StreamReader has the same iter_any()
            async def iter_any(self):
                while data := await reader.read(len(max(chunks, key=len)) or 1):
                    yield data

        out = [batch async for batch in batches(Content())]  # type: ignore[arg-type]
        assert all(0 < len(batch) <= LINES_PER_TURN for batch in out)
        return [line for batch in out for line in batch]

    return asyncio.run(collect())


def test_lines_are_split_across_any_chunk_boundary():
    a, b, c = event("ADDED", node("a")), event("ADDED", node("b")), bookmark("3", end=True)
    stream = a + b"\n" + b + b"\n" + c + b"\n"
    for size in (1, 7, 100, len(stream)):
        chunks = [stream[i:i + size] for i in range(0, len(stream), size)]
        assert split_into(chunks) == [a, b, c]
    many = [event("ADDED", node(f"n{i}")) for i in range(LINES_PER_TURN * 3 + 1)]
    assert split_into([b"\n".join(many) + b"\n"]) == many  # one chunk, several turns of the loop


async def _socket_stream():
    """A real socket pair: lines read from one end as a watch reads them, and a writer for the other."""
    import socket

    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    _, peer = await asyncio.open_connection(sock=theirs)

    class Content:
        keep = writer  # a StreamWriter closes its transport when collected

        async def iter_any(self):
            while data := await reader.read(1 << 20):
                yield data

    return Content(), peer


def test_once_current_reading_rests_after_the_stream_is_drained():
    async def run() -> None:
        content, peer = await _socket_stream()
        lines = batches(content, lambda: 30.0)
        peer.write(event("MODIFIED", node("a")) + b"\n")
        assert await asyncio.wait_for(anext(lines), 5) == [event("MODIFIED", node("a"))]
        waiting = asyncio.ensure_future(anext(lines))
        peer.write(event("MODIFIED", node("b")) + b"\n" + event("MODIFIED", node("c")) + b"\n")
        await asyncio.sleep(0.3)
        assert not waiting.done()  # resting: what arrived waits
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        peer.close()

    asyncio.run(run())


def test_a_build_is_read_without_rest_and_so_is_a_heavy_stream():
    async def run(resting: bool, chunk: bytes) -> None:
        content, peer = await _socket_stream()
        lines = batches(content, lambda: 30.0 if resting else 0.0)
        peer.write(chunk)
        got = [line async for line in _first(lines, chunk.count(b"\n"))]
        peer.write(event("MODIFIED", node("late")) + b"\n")
        assert await asyncio.wait_for(anext(lines), 5) == [event("MODIFIED", node("late"))]
        assert got == [line for line in chunk.split(b"\n") if line]
        peer.close()

    small = event("ADDED", node("a")) + b"\n"
    asyncio.run(run(False, small))  # building: no rest even after a small read
    heavy = b"".join(event("MODIFIED", node(f"n{i}", rv=str(i))) + b"\n" for i in range(CAUGHT_UP // 100))
    assert len(heavy) > 2 * CAUGHT_UP
    asyncio.run(run(True, heavy))  # current, but more was waiting: read on


async def _first(lines, count: int):
    """The first `count` lines of a batch iterator, within 5 s."""
    while count > 0:
        batch = await asyncio.wait_for(anext(lines), 5)
        count -= len(batch)
        for line in batch:
            yield line


def test_a_line_without_an_end_is_refused_past_the_limit():
    with pytest.raises(WatchError, match="longer than"):
        split_into([b"x" * (MAX_LINE // 4)] * 5)


def test_a_node_that_is_not_a_sliced_report_is_logged_once(feed, caplog):
    odd = {"metadata": {"name": "odd", "resourceVersion": "1"},
           "status": {"capacity": {"mthreads.com/sgpu-core": "24", "mthreads.com/sgpu-memory": "160"}}}
    feed.start_build()
    with caplog.at_level("WARNING"):
        for _ in range(5):  # the same status with every heartbeat
            feed.line(event("ADDED" if feed.build else "MODIFIED", odd))
        feed.line(bookmark("2", end=True))
        feed.line(event("MODIFIED", odd))
    lines = [r.getMessage() for r in caplog.records if "odd" in r.getMessage()]
    assert lines == ["node odd: mthreads.com/sgpu-core=24, mthreads.com/sgpu-memory=160 is not a sliced-card "
                     "report; ignored"]
    assert len(feed.view) == 0


@pytest.mark.parametrize(("version", "mode"), [
    ((1, 26), "list"), ((1, 27), "list"), ((1, 30), "list"), ((1, 31), "list"), ((1, 32), "stream"),
    ((1, 33), "list"), ((1, 34), "stream"), ((1, 37), "stream"), ((2, 0), "stream"),
])
def test_auto_streams_where_watchlist_is_on_by_default(version, mode):
    """Paged lists are the normal path where WatchList is off by default: chosen without a refusal first."""
    assert watch.mode_for(*version) == mode


@pytest.mark.parametrize(("environ", "server"), [
    ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "https://10.96.0.1:443"),
    ({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://[fd00:10:96::1]:6443"),
    ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None),
    ({"KUBERNETES_SERVICE_PORT": "443"}, None),
    ({"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": "443"}, None),
])
def test_in_a_pod_the_api_server_is_the_address_kubelet_gives(environ: dict[str, str], server: str | None) -> None:
    """As client-go's in-cluster config: the Service's address from the environment, no DNS name (the
    image's e2e test runs the real login this way, with no cluster DNS at all)."""
    assert client.in_cluster_server(environ) == server


def test_nodes_reporting_cores_but_no_sliced_card_are_kept_aside_for_the_audit() -> None:
    """What the view leaves out (sliced cores, no readable card) is kept by name with what it reported, in
    step with the watch and replaced whole by a rebuild: the audit judges it without listing Nodes."""
    def node(name: str, cores: str, memory: str) -> dict:
        return {"metadata": {"name": name}, "status": {"capacity": {CONFIG.core: cores, CONFIG.memory: memory}}}

    feed = NodeFeed(ClusterView(ready=False), CONFIG, Metrics())
    feed.start_build()
    feed.apply("ADDED", node("odd", "128", "1"))
    feed.apply("ADDED", node("fine", "128", "1280"))
    assert feed.unreadable == {}  # a build is not visible until it is complete
    feed.finish_build("1")
    assert feed.unreadable == {"odd": ("128", "1")}
    feed.apply("MODIFIED", node("odd", "128", "1280"))  # its device plugin fixed
    assert feed.unreadable == {}
    feed.apply("MODIFIED", node("fine", "16", "x"))
    feed.apply("DELETED", node("fine", "16", "x"))
    assert feed.unreadable == {}
    feed.apply("ADDED", node("gone", "128", "1"))
    feed.start_build()  # a rebuild that no longer lists it
    feed.finish_build("2")
    assert feed.unreadable == {}
