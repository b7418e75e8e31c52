"""Failover: the replicas probe each other and take a silent one out of the Service (`peerview` says why).

Each replica watches the Deployment's pods in its namespace (the node watch's machinery, `kube.watch.Watch`,
on `/api/v1/namespaces/<ns>/pods` with the chart's selector), asks every other one for its view at
`/peers` on the probe port every `interval` seconds, and answers the same question itself. What most of
them agree on is written to the silent replica's pod status: the readiness gate's condition `False` and
`Ready` `False` (as the node controller writes it when a node stops reporting), so the EndpointSlice
controller drops the endpoint even when the replica's kubelet is gone with its node. kubelet computes
`Ready` again from the gate once it is `True` again.

A replica vouches for itself once, when it is ready to answer after a start (the gate's condition is
absent on a new pod, so the pod is not Ready until then); after that only the others change it, except
that the last replica always vouches for itself.

Probes go to the plain-HTTP probe port, served by the same event loop as the webhook port: a replica
that cannot answer there (stopped, hung, cut off, its node dead) cannot answer a review either.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ..kube.client import Api, ApiError, Login
from ..kube.watch import Feed, Watch
from ..state import State
from .peerview import CONDITION, Outcomes, Replica, Timing, Verdict, View, disputed, judge, replica

__all__ = ["Failover"]

logger = logging.getLogger("hami_mt_webhook")

#: Probes of one peer allowed in flight at once: a silent one is asked again each interval, not piled on.
IN_FLIGHT = 3
#: A verdict written is not written again for this long while the watch has not shown its gate back yet.
ECHO_SECONDS = 2.0


class PeerFeed(Feed):
    """The Deployment's pods in, the replicas as `peerview` sees them kept up to date."""

    def __init__(self) -> None:
        self.replicas: dict[str, Replica] = {}

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        found = None if kind == "DELETED" else replica(obj)
        if self.build is not None:
            self.build.apply(kind, name, found)
        elif found is None:
            self.replicas.pop(name, None)
        else:
            self.replicas[name] = found

    def finish_build(self, resource_version: str | None) -> None:
        assert self.build is not None
        self.replicas, self.build = dict(self.build.nodes), None
        self.resource_version = resource_version or None
        self.synced_at = time.time()


@dataclass(frozen=True)
class Failover:
    """`serve`'s peer settings: who this replica is, how it finds the others, how often it asks them."""

    me: str
    namespace: str
    selector: str
    interval: float = 0.1
    timeout: float = 0.5
    timing: Timing = Timing()


class Peers:
    """The probe loop, the /peers answer and the verdicts of one replica; the others are asked on `port`,
    the probe port they share with this one."""

    def __init__(self, state: State, login: Login, failover: Failover, *, port: int, mode: str) -> None:
        self.state, self.login, self.port = state, login, port
        self.me, self.namespace = failover.me, failover.namespace
        self.interval, self.timeout, self.timing = failover.interval, failover.timeout, failover.timing
        self.feed = PeerFeed()
        self.watch = Watch(self.feed, login, path=f"/api/v1/namespaces/{self.namespace}/pods",
                           what="peer watch", mode=mode, label_selector=failover.selector, rest=0.0)
        self.vouched = False
        self._heard: dict[str, float] = {}  # name -> monotonic time last heard (or first asked)
        self._streak: dict[str, float] = {}  # name -> monotonic time its current run of answers began
        self._views: dict[str, View] = {}
        self._refused: set[str] = set()  # the peers whose last probe was refused
        self._outcomes: dict[str, Outcomes] = {}  # name -> its probes' outcomes over the window
        self._stalled_at = 0.0  # probes begun before this replica's own loop last stalled are not counted
        self._in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # probes and writes, held until done (the loop holds
        self._writing: set[str] = set()  # weak references only); the replicas whose verdict is being written
        self._written: dict[str, tuple[bool, float]] = {}  # name -> what this replica last wrote, and when
        self._out_since: dict[str, float] = {}  # name -> monotonic time the watch first showed its gate False
        self._api: Api | None = None
        self._http: aiohttp.ClientSession | None = None

    # the answer ---------------------------------------------------------------------------------------

    def view(self) -> View:
        now = time.monotonic()
        heard = {name: now - t for name, t in self._heard.items()}
        return View(self.me, heard, frozenset(n for n, s in heard.items() if s >= self.timing.silent_after),
                    self._failing(now))

    def _failing(self, now: float) -> dict[str, float]:
        """Each peer's share of failed or late probes over the window, for those with enough of them."""
        return {name: share for name, o in self._outcomes.items() if (share := o.share(now)) is not None}

    def answer(self) -> bytes:
        """GET /peers: this replica's view, which is also how the others know it answers."""
        return orjson.dumps(self.view().to_json())

    # the loop -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        watching = asyncio.create_task(self.watch.keep_running(), name="peer watch")
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=IN_FLIGHT, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=self.timeout), headers={"User-Agent": "hami-mt-webhook peers"})
        logger.info("failover on: probing the other replicas every %.2f s; one not heard for %.2f s, or whose "
                    "probes fail or take over %.2f s %.0f %% of the time over %g s, by most of them is taken out "
                    "of the Service", self.interval, self.timing.silent_after, self.timing.late_after,
                    100 * self.timing.fail_share, self.timing.window)
        try:
            last = time.monotonic()
            while True:
                started = time.monotonic()
                stalled = started - last - self.interval
                if stalled > self.timeout:
                    # This replica's own loop was held up (a CPU-starved node, a long collection): what it
                    # did not hear meanwhile says nothing of the others, so the stall is not counted.
                    for name, heard in self._heard.items():
                        self._heard[name] = min(started, heard + stalled)
                    self._stalled_at = started
                last = started
                self._probe_all()
                self._decide()
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            watching.cancel()
            for task in list(self._tasks):
                task.cancel()
            await self._http.close()
            if self._api is not None:
                await self._api.close()

    def _probe_all(self) -> None:
        now = time.monotonic()
        peers = {name: r for name, r in self.feed.replicas.items() if name != self.me and not r.deleting}
        for name in list(self._heard):
            if name not in peers:
                for known in (self._heard, self._streak, self._views, self._in_flight, self._written,
                              self._outcomes):
                    known.pop(name, None)
                self._refused.discard(name)
        for name, r in peers.items():
            self._heard.setdefault(name, now)
            if self._in_flight.get(name, 0) < IN_FLIGHT:
                self._in_flight[name] = self._in_flight.get(name, 0) + 1
                self._spawn(self._probe(name, r.ip), f"probe {name}")

    async def _probe(self, name: str, ip: str) -> None:
        assert self._http is not None
        host = f"[{ip}]" if ":" in ip else ip
        began = time.monotonic()
        try:
            async with self._http.get(f"http://{host}:{self.port}/peers") as resp:
                body = await resp.read() if resp.status == 200 else b""
            view = View.from_json(orjson.loads(body))
            if view.name != name:
                raise ValueError(f"{ip} answers as {view.name}")  # an address already given to another pod
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
            self._views.pop(name, None)
            self._streak.pop(name, None)
            self._outcome(name, began, failed=True)
            logger.debug("peer %s (%s) did not answer: %s", name, ip, type(err).__name__)
            if isinstance(err, aiohttp.ClientConnectorError) and err.os_error.errno == errno.ECONNREFUSED:
                # Nothing listens there (a crash, an OOM kill): judged now, not at the loop's next turn, since
                # every call kube-apiserver sends there meanwhile is a refused pod.
                self._refused.add(name)
                self._decide()
        else:
            self._refused.discard(name)
            if name in self._heard:
                now = time.monotonic()
                self._outcome(name, began, failed=now - began > self.timing.late_after)
                self._heard[name] = now
                self._streak.setdefault(name, now)
                self._views[name] = view
        finally:
            if name in self._in_flight:
                self._in_flight[name] -= 1

    def _outcome(self, name: str, began: float, *, failed: bool) -> None:
        """A probe's outcome into the peer's window, unless this replica's own loop stalled meanwhile (what
        ran late then says nothing of the peer)."""
        if began >= self._stalled_at and name in self._heard:
            self._outcomes.setdefault(name, Outcomes(self.timing.window)).add(time.monotonic(), failed)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _decide(self) -> None:
        replicas = self.feed.replicas
        if self.feed.synced_at is None:
            return
        now = time.monotonic()
        heard = {name: now - t for name, t in self._heard.items()}
        self._out_since = {name: self._out_since.get(name, now) for name, r in replicas.items()
                           if r.answering is False}
        # A replica marked out is put back after answering for `recover_after` since the mark, not since its
        # answers began: another replica's probe meets a crash a moment before this one's does, and the
        # streak this one counts from before the crash must not overturn that verdict.
        answering = {name: now - max(t, self._out_since.get(name, t)) for name, t in self._streak.items()}
        failing = self._failing(now)
        own = replicas.get(self.me)
        verdicts = {v.name: v for v in judge(self.me, replicas, heard, answering, self._views, self.timing,
                                                self._refused, failing)}
        if not self.vouched and own is not None and self.state.view.ready and self.state.serving:
            if own.answering is True:
                self.vouched = True
            else:
                verdicts[self.me] = Verdict(self.me, True, 1, len(replicas), "started and ready to answer")
        for verdict in verdicts.values():
            written = self._written.get(verdict.name)
            target = replicas[verdict.name]
            if verdict.name in self._writing or (written is not None and written[0] is verdict.answering
                                                 and target.answering is not verdict.answering
                                                 and now - written[1] < ECHO_SECONDS):
                continue  # being written, or written just now and not yet seen back through the watch
            # Written beside the loop: a slow API server must not stop the probes (a replica that asks
            # nobody would soon hear nobody, and say so to the others).
            self._writing.add(verdict.name)
            self._spawn(self._write(verdict, target), f"verdict on {verdict.name}")
        split = disputed(self.me, replicas, heard, self._views, self.timing, failing)
        self.state.metrics.peer_failures({name: failing.get(name) for name in heard})
        self.state.metrics.peers_seen(answering=sum(1 for s in heard.values() if s < self.timing.silent_after),
                                      silent=sum(1 for s in heard.values() if s >= self.timing.silent_after),
                                      disputed=len(split))

    async def _write(self, verdict: Verdict, target: Replica) -> None:
        """The verdict onto the pod's status (logged and counted), or a warning if the API server could not
        take it: the next round tries again."""
        try:
            if await self._patch(verdict, target) and verdict.name == self.me:
                self.vouched = True
        finally:
            self._writing.discard(verdict.name)

    async def _patch(self, verdict: Verdict, target: Replica) -> bool:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = "PeersHearIt" if verdict.answering else "PeersDoNotHearIt"
        message = (f"{verdict.reason}; {verdict.agreed} of {verdict.of} replicas agree "
                   f"(judged by {self.me})")
        conditions = [{"type": CONDITION, "status": "True" if verdict.answering else "False",
                       "reason": reason, "message": message, "lastTransitionTime": stamp}]
        if not verdict.answering and target.ready:
            conditions.append({"type": "Ready", "status": "False", "reason": reason, "message": message,
                               "lastTransitionTime": stamp})
        path = f"/api/v1/namespaces/{self.namespace}/pods/{verdict.name}/status"
        try:
            # not asked again on the server's word: the next round judges afresh, a moment later
            await self._client().call("PATCH", path, {"status": {"conditions": conditions}}, ok=(200,),
                                      retries=0, timeout=2, content_type="application/strategic-merge-patch+json")
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as err:
            logger.warning("could not mark replica %s %s: %s", verdict.name,
                           "answering" if verdict.answering else "not answering", err)
            with contextlib.suppress(Exception):
                await self._reset_api()
            return False
        self._written[verdict.name] = (verdict.answering, time.monotonic())
        self.state.metrics.peer_verdict(verdict.answering)
        log = logger.info if verdict.answering else logger.warning
        log("replica %s marked %s: %s", verdict.name,
            "answering (back in the Service's endpoints)" if verdict.answering else
            "not answering (out of the Service's endpoints)", message)
        return True

    def _client(self) -> Api:
        if self._api is None:
            info = self.login()
            if info is None:
                raise ApiError("no kubeconfig and no service account")
            self._api = Api.open(info)
        return self._api

    async def _reset_api(self) -> None:
        """A fresh session after a failure: a rotated token is read again, a dead connection dropped."""
        if self._api is not None:
            api, self._api = self._api, None
            await api.close()
