"""The background audit: one replica at a time reads what admission never saw, judges it with the admission
rules (`audit.findings`) and publishes the findings: PolicyReports (`audit.reports`), a Warning Event on each
workload whose pods would be refused (`events`), and metrics.

kopf drives it as it drives the process (login, signals, shutdown): its startup handler starts the loop and
its cleanup handler stops it and hands the Lease back, so on SIGTERM another replica audits at once. kopf's
other means do not fit here: a `kopf.timer` puts a finalizer on the object it runs
on (an uninstall would leave that object Terminating), its peering needs CRDs of its own and pauses all of
kopf's handling in the other replicas, and its watches keep every object in memory (`nodewatch` says what
that cost at 10,000 nodes). So a Lease (`kube.lease`, as client-go's leader election holds one) picks
the replica that audits; another takes over once it has seen the Lease unrenewed for its duration. A pass
reads with paged lists (no watch of every pod in every replica), judges each page as it comes, a slice at a
time between turns of the event loop so that reviews are not held up, and keeps only the findings. Nodes are
judged from the replica's own node view, which its watch keeps current: a pass lists none.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp

from ...audit import reports
from ...audit.findings import FAIL, WARN, Audit, Auditing, NotReady, Result, counted
from ...audit.objects import Obj, metadata
from ...rules import templates
from ...rules.text import clip
from ..kube.client import Api, ApiError, Login
from ..kube.lease import Lease
from ..state import State
from .events import EventLimit, event

__all__ = ["AuditSettings"]

logger = logging.getLogger("hami_mt_webhook")
T = TypeVar("T")

#: Objects per page: a pass holds about one page of objects at once, and parsing one takes under a
#: millisecond (on the event loop: a thread would hold the interpreter's lock all the same, and leave its own
#: malloc arena behind). At 100 a page and 25 a slice, 15 % of the creations during a pass at 50,000 pods
#: took over 25 ms through kube-apiserver against 3 % outside it; at 50 and 5, as few during a pass as
#: outside (docs/PERFORMANCE.md).
PAGE = 50
#: Objects judged between two turns of the event loop: about 0.1 ms each, so a review waits well under 1 ms.
SLICE = 5
#: After each page, a rest this many times as long as fetching and judging it took (`_paced`).
REST = 1.0
#: How many times rarer CPython's full collections are while a pass runs (`_rare_full_collections`).
FULL_COLLECTIONS_RARER = 10
#: Pods that will not change again are not audited.
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
REPORTS = f"/apis/{reports.API_VERSION}"
@dataclass(frozen=True)
class AuditSettings:
    """`serve`'s audit settings: how often, who this replica is, and the Lease that picks the auditor."""

    me: str
    namespace: str
    interval: float = 120.0
    lease: str = "hami-mt-webhook-audit"
    lease_seconds: float = 15.0
    policy_reports: bool = True
    events: bool = True
    event_every: float = 3600.0


class Auditor:
    """The audit loop of one replica: a pass every `interval` while it holds the Lease."""

    def __init__(self, state: State, login: Login, settings: AuditSettings,
                 unreadable: Callable[[], Mapping[str, tuple[object, object]]] = dict) -> None:
        self.state, self.login, self.settings = state, login, settings
        #: The nodes the node view keeps aside as no sliced card's (`NodeFeed.unreadable`): with the view's own
        #: reports, what the nodes' findings are judged from, so that a pass lists no Node.
        self.unreadable = unreadable
        self.lease = Lease(settings.me, settings.namespace, settings.lease, settings.lease_seconds)
        self.events = EventLimit(settings.event_every)
        self.last: Audit | None = None
        self._reports_absent = False
        self._task: asyncio.Task[None] | None = None
        self._forbidden: set[str] = set()  # the kinds this replica may not list, logged once each
        #: When the next pass is due: a failed pass waits an interval too, as does one that lost the Lease.
        self._next = 0.0
        if state.metrics is not None:
            state.metrics.audit_interval.set(settings.interval)

    def start(self) -> None:
        """The loop as a task of its own (kopf's startup calls it)."""
        self._task = asyncio.create_task(self.run(), name="audit")

    async def stop(self) -> None:
        """The loop ended and the Lease handed back, so another replica audits at once (kopf's cleanup)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _count(self, verb: str, resource: str) -> None:
        if self.state.metrics is not None:
            self.state.metrics.audit_requests.labels(verb, resource).inc()

    async def run(self) -> None:
        while True:
            info = self.login()
            if info is None:
                await asyncio.sleep(self.settings.lease_seconds)
                continue
            try:
                async with Api.open(info, count=self._count) as api:
                    try:
                        await self._lead(api)
                    finally:
                        await asyncio.shield(self._let_go(api))
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the audit never takes the replica down with it
                logger.warning("audit: %s; trying again in %.0f s", clip(str(err), 300),
                               self.settings.lease_seconds)
                self._lost()
                await asyncio.sleep(self.settings.lease_seconds)

    async def _let_go(self, api: Api) -> None:
        try:
            await self.lease.release(api)
        except (TimeoutError, aiohttp.ClientError, ApiError):
            pass
        self._lost()

    def _lost(self) -> None:
        self.lease.holding = False
        if self.state.metrics is not None:
            self.state.metrics.audit_lost()

    async def _lead(self, api: Api) -> None:
        """Renew or wait for the Lease every third of its duration; pass when due while holding it."""
        renew = self.settings.lease_seconds / 3
        while True:
            was = self.lease.holding
            if await self.lease.hold(api):
                if not was:
                    logger.info("audit: this replica audits now (Lease %s/%s)", self.settings.namespace,
                                self.settings.lease)
                if self.state.metrics is not None:
                    self.state.metrics.audit_leader.set(1)
                if time.monotonic() >= self._next:
                    self._next = time.monotonic() + self.settings.interval
                    try:
                        await self._pass_renewing(api, renew)
                    except (ApiError, aiohttp.ClientError, TimeoutError) as err:  # the Lease is kept
                        logger.warning("audit: the pass failed: %s; the next one in %.0f s", clip(str(err), 300),
                                       self.settings.interval)
            elif was:
                logger.info("audit: another replica audits now")
                self._lost()
            # the next renewal, or the next pass if it is due sooner: passes keep to the interval
            wait = renew if not self.lease.holding else min(renew, self._next - time.monotonic())
            await asyncio.sleep(max(0.0, wait))

    async def _pass_renewing(self, api: Api, renew: float) -> None:
        """A pass, with the Lease renewed beside it; a pass that loses the Lease writes nothing."""
        with _rare_full_collections():
            work = asyncio.ensure_future(self.audit_pass(api))
            if not await _renewing(work, lambda: self.lease.hold(api), renew, self.lease.seconds):
                logger.info("audit: the Lease was lost during a pass; another replica audits now")
                self._lost()
        if not work.cancelled():
            work.result()

    async def audit_pass(self, api: Api) -> Audit | None:
        """Read, judge, publish; None when the node view is not read yet (tried again next interval)."""
        started, wall = time.monotonic(), time.time()
        metrics = self.state.metrics
        if not self.state.view.ready:  # before any read: nothing can be judged yet
            logger.info("audit: pass skipped: the node view is not read yet")
            return None
        namespaces = [n async for page in api.pages("/api/v1/namespaces", PAGE) for n in page]
        configurations = await self._configurations(api)
        try:
            auditing = Auditing(namespaces, configurations, self.state.view, self.state.config)
            workloads: list[Result] = []
            # Namespace by namespace: kube-apiserver's watch cache walks a list's whole key range from the
            # page's start for every page, so one cluster-wide list costs it the square of the pod count.
            for namespace in namespaces:
                path = f"/api/v1/namespaces/{quote(str(metadata(namespace).get('name') or ''))}/pods"
                async for page in _paced(api.pages(path, PAGE, fieldSelector=LIVE_PODS)):
                    await _judge(page, auditing.pod)
            async for page, kind in self._workloads(api):
                for w in page:
                    w.setdefault("apiVersion", kind[0])
                    w.setdefault("kind", kind[1])
                workloads += await _judge(page, auditing.workload)
            await _judge(list(self.state.view), auditing.view_node)  # a slice at a time: 10,000 of them
            auditing.view_nodes_aside(self.unreadable())
        except NotReady as err:
            logger.info("audit: pass skipped: %s", err)
            return None
        result = auditing.result
        if self.settings.policy_reports:
            await self._publish(api, result, int(wall))
        if self.settings.events:
            await self._send_events(api, self.events.due(workloads, time.monotonic()))
        took = time.monotonic() - started
        self.last = result
        if metrics is not None:
            metrics.audit_done(counted(result.results), took)
        logger.info("audit: %d objects judged in %.1f s: %d failures, %d warnings", result.judged, took,
                    sum(r.result == FAIL for r in result.results), sum(r.result == WARN for r in result.results))
        return result

    async def _configurations(self, api: Api) -> list[Obj]:
        """The webhook configurations, each with its kind; none where this replica may not read them (the
        shipped ones then stand in)."""
        out: list[Obj] = []
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            path = f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}s"
            try:
                out += [{**c, "kind": kind} async for page in api.pages(path, PAGE) for c in page]
            except ApiError as err:
                if err.status not in (403, 404):
                    raise
        return out

    async def _workloads(self, api: Api) -> AsyncIterator[tuple[list[Obj], tuple[str, str]]]:
        """Each checked kind's objects a page at a time, with (apiVersion, kind); a kind whose API is not
        served (a training operator not installed) is passed over."""
        for kind in templates.KINDS:
            for version in kind.versions:
                api_version = f"{kind.group}/{version}" if kind.group else version
                path = f"/apis/{api_version}/{kind.resource}" if kind.group else f"/api/v1/{kind.resource}"
                try:
                    async for page in api.pages(path, PAGE):
                        yield page, (api_version, kind.kind)
                except ApiError as err:
                    if err.status == 404:
                        continue  # not served: the operator is not installed, or serves another version
                    if err.status != 403:
                        raise
                    if path not in self._forbidden:  # one kind out of reach: the others are still judged
                        logger.warning("audit: no permission to list %s; its workloads are not audited (the "
                                       "chart's ClusterRole hami-mt-webhook-audit grants it)", path)
                        self._forbidden.add(path)
                break

    async def _publish(self, api: Api, result: Audit, now: int) -> None:
        current: dict[str, Obj] = {}
        selector = f"{reports.MANAGED[0]}={reports.MANAGED[1]}"
        try:
            for plural in ("policyreports", "clusterpolicyreports"):
                current.update(reports.by_namespace(
                    [r async for page in api.pages(f"{REPORTS}/{plural}", 10, labelSelector=selector)
                     for r in page]))  # a report holds up to 1,000 results: pages of 10 parse in a few ms
        except ApiError as err:
            if err.status != 404:
                raise
            if not self._reports_absent:
                logger.info("audit: the wgpolicyk8s.io PolicyReport CRDs are not installed: findings go to the "
                            "metrics and Events only (the chart installs the CRDs with "
                            "audit.policyReports.installCRDs=true)")
            self._reports_absent = True
            return
        self._reports_absent = False
        await asyncio.sleep(0)
        changes = reports.plan(current, reports.desired(result, now, current))
        await asyncio.sleep(0)
        for obj, version in changes.write:
            ns = metadata(obj).get("namespace")
            base = f"{REPORTS}/namespaces/{ns}/policyreports" if ns else f"{REPORTS}/clusterpolicyreports"
            if version:
                obj["metadata"]["resourceVersion"] = version
                await api.call("PUT", f"{base}/{reports.REPORT}", obj, ok=(200, 404, 409))
            else:
                await api.call("POST", base, obj, ok=(201, 404, 409))  # 404: its namespace went meanwhile
        for ns in changes.delete:
            path = (f"{REPORTS}/namespaces/{ns}/policyreports/{reports.REPORT}" if ns
                    else f"{REPORTS}/clusterpolicyreports/{reports.REPORT}")
            await api.call("DELETE", path, ok=(200, 202, 404))

    async def _send_events(self, api: Api, results: list[Result]) -> None:
        for r in results:
            await api.call("POST", f"/api/v1/namespaces/{quote(r.subject.namespace)}/events",
                           event(r, self.settings.me), ok=(201, 403, 404))


async def _renewing(work: asyncio.Future[Any], hold: Callable[[], Awaitable[bool]], renew: float,
                    seconds: float) -> bool:
    """`hold` the Lease every `renew` seconds until `work` is done: False, `work` cancelled, once it is lost.

    A renewal the API server fails is tried again at the next, as long as the last one is younger than the
    Lease's `seconds` less a renewal; past that another replica may take over before `work` would write, so
    `work` is cancelled and the error raised. Whatever ends this (a cancellation too) leaves `work` ended."""
    renewed = time.monotonic()
    try:
        while not work.done():
            await asyncio.wait([work], timeout=renew)
            if work.done():
                break
            asked = time.monotonic()
            try:
                held = await hold()
            except (ApiError, aiohttp.ClientError, TimeoutError) as err:
                if asked - renewed + renew < seconds:
                    logger.warning("audit: the Lease not renewed: %s; tried again in %.0f s", clip(str(err), 300),
                                   renew)
                    continue
                raise
            if not held:
                return False
            renewed = asked
        return True
    finally:
        if not work.done():
            work.cancel()
        await asyncio.wait([work])


async def _judge(items: Sequence[T], judge: Callable[[T], list[Result]]) -> list[Result]:
    """Each item judged, `SLICE` at a time between turns of the loop; the findings."""
    found: list[Result] = []
    for start in range(0, len(items), SLICE):
        for item in items[start:start + SLICE]:
            found += judge(item)
        await asyncio.sleep(0)
    return found


@contextlib.contextmanager
def _rare_full_collections() -> Iterator[None]:
    """Full collections by CPython's cyclic garbage collector ten times rarer while a pass runs. A full
    collection visits every reference of every object it walks, the page being judged among them: at the
    default thresholds one came every 0.3 s of a pass and held the event loop 6-20 ms each time (measured at
    10,000 nodes), and reviews waited on it. None at all would let a pass's cyclic garbage (its responses)
    pile up until it ends. The thresholds are put back when the pass ends."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], thresholds[2] * FULL_COLLECTIONS_RARER)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


async def _paced(pages: AsyncIterator[list[Obj]], rest: float = REST) -> AsyncIterator[list[Obj]]:
    """`pages`, with a rest after each as long as fetching and judging it took, times `rest`: what a pass asks
    of the API server (which serves a page of pods from etcd for each request) and of the replica's core is
    spread over (1 + rest) times as long, a pass of 50,000 pods still inside a minute."""
    began = time.perf_counter()
    async for page in pages:
        yield page
        await asyncio.sleep((time.perf_counter() - began) * rest)
        began = time.perf_counter()
