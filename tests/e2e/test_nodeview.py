"""The node view against a real kube-apiserver: complete after every disconnect, current on change,
and never in the way of reviews while it is rebuilt.

The webhook reaches the API server through a TCP relay (TLS passes through it untouched) that the
tests cut, as a network partition would; the API server itself is real, and so is its restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import apply_nodes, example_nodes
from devtools.clusters.local import LocalWebhook
from devtools.load import fleet
from devtools.load.traffic import LoopThread
from hami_mt_webhook.service.kube import watch
from tests.builders import make_pod, review_body

from .support import MEMORY, VGPU, apply, metric, pod, wait_for
from .traffic import Balancer

#: Enough real-sized nodes that parsing them in one go would hold the event loop for a noticeable time.
FLEET = 2500
NS = "e2e-nodeview"


class Relay(Balancer):
    """The path from the webhook to the API server, which a test can cut and mend."""

    def __init__(self, lt: LoopThread, cp: ControlPlane) -> None:
        super().__init__(lt, [cp.apiserver_port])
        self.backend = cp.apiserver_port
        self.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"  # the API server's certificate names 127.0.0.1

    def mend(self) -> None:
        self.add(self.backend)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[ControlPlane, Relay, LocalWebhook]]:
    lt = LoopThread()
    with ControlPlane() as cp:
        relay = Relay(lt, cp)
        hook = LocalWebhook(cp, tmp_path_factory.mktemp("nodeview"), api_server=relay.url)
        hook.install()
        apply_nodes(cp, example_nodes())
        asyncio.run(_create_fleet(cp))
        cp.kubectl("create", "namespace", NS)
        hook.start(timeout=120)
        try:
            yield cp, relay, hook
        finally:
            hook.stop()
            relay.stop()
            lt.close()


async def _create_fleet(cp: ControlPlane) -> None:
    async with fleet.session(cp.server, fleet.admin_context(cp)) as s:
        await fleet.create(s, range(FLEET))


def sliced_in_api(cp: ControlPlane) -> int:
    nodes = json.loads(cp.kubectl("get", "nodes", "-o", "json", timeout=120).stdout)["items"]
    return sum(1 for n in nodes if int(n["status"].get("capacity", {}).get("mthreads.com/sgpu-core", "0")) > 0)


def exclusive_fill(cp: ControlPlane, node: str) -> str:
    """What the webhook fills for an exclusive pod pinned to `node` (dry run: nothing is stored)."""
    manifest = pod(f"pinned-{node}", {VGPU: 1}, nodeSelector={"kubernetes.io/hostname": node})
    r = apply(cp, NS, manifest, "--dry-run=server", "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["spec"]["containers"][0]["resources"]["limits"][MEMORY]


def test_a_capacity_change_reaches_the_view(cluster):
    cp, _, _ = cluster
    name = fleet.name_of(0)  # an S5000: 8 cards of 160
    assert exclusive_fill(cp, name) == "160"
    cp.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"capacity": {MEMORY: "1408"}}}))  # overcommitted: 176 a card
    wait_for("the new capacity is used", lambda: exclusive_fill(cp, name) == "176")


def test_nodes_deleted_during_a_partition_leave_the_view(cluster):
    cp, relay, hook = cluster
    gone, added = fleet.name_of(3), fleet.name_of(FLEET + 1)
    assert exclusive_fill(cp, gone) == "160"
    relay.cut()
    try:
        cp.kubectl("delete", "node", gone)
        asyncio.run(_add(cp, FLEET + 1))
        # Cut off, the replica keeps answering from the last view and says so in its metrics.
        wait_for("the watch is reported down", lambda: metric(hook, "hami_mt_webhook_node_watch_up") == 0)
        assert hook.ready()
        assert metric(hook, "hami_mt_webhook_node_view_age_seconds") > 0
        assert exclusive_fill(cp, gone) == "160"
    finally:
        relay.mend()
    expected = sliced_in_api(cp)
    wait_for("the view equals the API's node set", lambda: metric(hook, "hami_mt_webhook_sliced_nodes") == expected)
    assert exclusive_fill(cp, gone) == "96"  # no such node any more: the memoryPerCard fallback
    assert exclusive_fill(cp, added) == str(fleet.model_of(FLEET + 1).per_card)


async def _add(cp: ControlPlane, i: int) -> None:
    async with fleet.session(cp.server, fleet.admin_context(cp)) as s:
        await fleet.create(s, [i])


def test_after_an_api_server_restart_the_view_is_rebuilt_and_reviews_go_on(cluster):
    cp, relay, hook = cluster
    gone = fleet.name_of(6)
    relists = metric(hook, "hami_mt_webhook_node_relists_total")
    turns, held = _loop_turns(hook)
    log_start = hook.log.stat().st_size
    relay.cut()
    cp.kubectl("delete", "node", gone)
    cp.restart_apiserver()  # its watch cache starts after the deletion: resuming from before it is impossible
    probe = Prober(hook)
    with probe:
        relay.mend()
        expected = sliced_in_api(cp)
        wait_for("the view equals the API's node set",
                 lambda: metric(hook, "hami_mt_webhook_sliced_nodes") == expected, timeout=60)
        wait_for("the rebuild is logged", lambda: "node view rebuilt" in _log_since(hook, log_start))
    assert metric(hook, "hami_mt_webhook_node_relists_total") == relists + 1
    assert exclusive_fill(cp, gone) == "96"
    assert hook.ready()

    # The whole set was read again in small turns of the loop, none of which held it for long: what the
    # replica measures of itself, since a review's round trip from this process also waits for this
    # process's relay and for the restarted API server, both busy with the same nodes on the same cores.
    turns_after, held_after = _loop_turns(hook)
    most = max(watch.LINES_PER_TURN, watch.PAGE_SIZE)  # a streamed turn's lines, or a list's page
    assert turns_after - turns >= expected // most, f"{expected} nodes read in {turns_after - turns:.0f} turns"
    assert held_after == held, f"{held_after - held:.0f} turns held the loop for {HELD} s or more"

    # And reviews sent straight to the webhook while it read the set were all answered.
    start, end = _rebuild_window(_log_since(hook, log_start))
    during = [(sent, took) for sent, took, ok in probe.results if sent <= end and sent + took >= start]
    assert all(ok for *_, ok in probe.results), "a review failed during the rebuild"
    assert during, f"no review overlapped the rebuild ({start:.3f}–{end:.3f})"
    worst = max(took for _, took in during)
    print(f"rebuild {end - start:.3f} s in {turns_after - turns:.0f} turns, {len(during)} reviews overlapped, "
          f"worst round trip {worst * 1000:.1f} ms")


#: A turn of the loop this long is one a review would notice; a turn of LINES_PER_TURN of these nodes takes
#: about a third of a millisecond, a page of a list a few (all 2500 in one go, about 50 ms: the count of turns
#: is what tells that).
HELD = "0.1"


def _loop_turns(hook: LocalWebhook) -> tuple[float, float]:
    """Turns of the loop the node feed has taken, and those that held it for HELD seconds or more."""
    count = metric(hook, "hami_mt_webhook_node_work_seconds_count")
    return count, count - metric(hook, "hami_mt_webhook_node_work_seconds_bucket", le=HELD)


def _log_since(hook: LocalWebhook, offset: int) -> str:
    with open(hook.log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _rebuild_window(log: str) -> tuple[float, float]:
    """Wall times of the rebuild's first and last log lines."""
    def when(pattern: str) -> float:
        for line in log.splitlines():
            if re.search(pattern, line):
                stamp = json.loads(line)["time"]
                return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.UTC).timestamp()
        raise AssertionError(f"no log line matching {pattern!r}:\n{log[-3000:]}")
    return when(r"reading the complete node set \(rebuild"), when("node view rebuilt")


class Prober:
    """Sends an exclusive-pod review straight to the webhook every 5 ms in a thread, timing each."""

    def __init__(self, hook: LocalWebhook) -> None:
        self.url = f"{hook.url}/mutate-pods"
        self.context = ssl.create_default_context(cafile=str(hook.certs.bundle))
        self.body = orjson.dumps(review_body(make_pod()))  # vgpu 1 alone: an exclusive fill
        self.results: list[tuple[float, float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.context))
        while not self._stop.is_set():
            sent = time.time()
            request = urllib.request.Request(self.url, data=self.body, headers={"Content-Type": "application/json"})
            try:
                with opener.open(request, timeout=5) as r:
                    ok = json.loads(r.read())["response"]["allowed"] is True
            except OSError:
                ok = False
            self.results.append((sent, time.time() - sent, ok))
            time.sleep(0.005)



def test_paged_lists_give_the_same_view(cluster, tmp_path):
    """`--node-watch list`, what servers before streaming lists get: pages of nodes, then a watch."""
    cp, relay, first = cluster
    hook = LocalWebhook(cp, tmp_path, api_server=relay.url, extra_args=["--node-watch", "list"])
    hook.install()
    hook.start(timeout=120)
    try:
        expected = sliced_in_api(cp)
        assert metric(hook, "hami_mt_webhook_sliced_nodes") == expected
        first_log = first.log.read_text()
        # The session's webhook (`auto`): streams where WatchList is on by default, paged lists without a warning
        # where it is off.
        if cp.minor == 32 or cp.minor >= 34:
            assert "streaming list (WatchList)" in first_log and "paged" not in first_log
        else:
            assert "paged list, then watch (WatchList is off by default in this version)" in first_log
            assert "refuses streaming lists" not in first_log
        cp.kubectl("delete", "node", fleet.name_of(9))
        wait_for("the deletion reaches the view",
                 lambda: metric(hook, "hami_mt_webhook_sliced_nodes") == expected - 1)
    finally:
        hook.stop()
