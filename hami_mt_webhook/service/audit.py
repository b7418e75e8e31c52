"""The background audit: one replica at a time reads what admission never saw, judges it with the admission
rules (`audit.findings`) and publishes the findings: PolicyReports (`audit.reports`), a Warning Event on each
workload whose pods would be refused, and metrics.

kopf drives it as it drives the process (login, signals, shutdown): its startup handler starts the loop and
its cleanup handler stops it and hands the Lease back, so on SIGTERM another replica audits at once. kopf's
other means do not fit here: a `kopf.timer` puts a finalizer on the object it runs
on (an uninstall would leave that object Terminating), its peering needs CRDs of its own and pauses all of
kopf's handling in the other replicas, and its watches keep every object in memory (`nodewatch` says what
that cost at 10,000 nodes). So a Lease (coordination.k8s.io, as client-go's leader election does it) picks
the replica that audits; another takes over once it has seen the Lease unrenewed for its duration. A pass
reads with paged lists (no watch of every pod in every replica), judges each page as it comes, a slice at a
time between turns of the event loop so that reviews are not held up, and keeps only the findings. Nodes are
judged from the replica's own node view, which its watch keeps current: a pass lists none.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import orjson

from ..audit import reports
from ..audit.findings import FAIL, WARN, Audit, Auditing, NotReady, Result, counted
from ..audit.objects import Obj, Subject, mapping, metadata
from ..rules import templates
from ..rules.text import clip
from .state import State
from .watch import Login, session

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
#: Events a pass sends at most, whatever the findings: the API server is never flooded by the audit.
EVENTS_PER_PASS = 20
EVENT_REASONS = {FAIL: "PodsDenied", WARN: "PodsWouldBeDenied"}
#: client-go's rule for an answer that says when to come back (a Retry-After header on 429 or 500-504, as
#: kube-apiserver gives while a resource's watch cache re-initialises or its fairness queues are full): wait
#: that long and ask again, up to this many times, so a pass is not lost to a second of the server's.
RETRIES = 10
#: The longest Retry-After honoured, in seconds: a pass does not sleep on a server's word for minutes.
RETRY_AFTER_MAX = 10.0


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


class ApiError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Api:
    """The few calls the audit makes, each counted by verb and resource in the metrics."""

    def __init__(self, client: aiohttp.ClientSession, server: str, count: Callable[[str, str], None]) -> None:
        self.client, self.server, self.count = client, server, count

    async def call(self, verb: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                   ok: Iterable[int] = (200, 201), retries: int = RETRIES) -> tuple[int, Any]:
        """One request, asked again while the server says when to (`RETRIES`); an answer outside `ok`
        raises `ApiError`."""
        accepted = frozenset(ok)
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        for attempt in range(retries + 1):
            self.count(verb, _resource(path))
            async with self.client.request(verb, self.server + path, data=data, params=params, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=60)) as resp:
                raw = await resp.read()
            wait = _retry_after(resp.status, resp.headers.get("Retry-After"))
            if wait is None or resp.status in accepted or attempt == retries:
                break
            await asyncio.sleep(wait)
        if resp.status not in accepted:
            raise ApiError(f"HTTP {resp.status} from {verb} {path}: {raw[:300].decode(errors='replace')}",
                           resp.status)
        return resp.status, orjson.loads(raw) if raw else None

    async def pages(self, path: str, **params: str) -> AsyncIterator[list[Obj]]:
        """The items of a paged list, a page at a time."""
        query = {"limit": str(PAGE), **params}
        while True:
            _, page = await self.call("GET", path, params=query)
            yield [item for item in page.get("items") or () if isinstance(item, dict)]
            token = mapping(page.get("metadata")).get("continue")
            if not token:
                return
            query["continue"] = token


def _retry_after(status: int, header: str | None) -> float | None:
    """Seconds to wait before asking again, or None when the answer is final (client-go's `checkWait`)."""
    if header is None or not (status == 429 or 500 <= status <= 504):
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None  # an HTTP date: kube-apiserver never sends one
    return min(max(seconds, 0.0), RETRY_AFTER_MAX)


def _resource(path: str) -> str:
    """`pods`, `policyreports`, `leases`: the resource a path names, for the request counter."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        return rest[2]
    return rest[0] if rest else "other"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Lease:
    """One replica at a time: held while renewed every third of its duration, taken over by another once it
    has seen the Lease unchanged for a whole duration (its own clock: no trust in the holder's)."""

    def __init__(self, me: str, namespace: str, name: str, seconds: float) -> None:
        self.me, self.seconds = me, seconds
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.name, self.namespace = name, namespace
        self.holding = False
        self._seen: tuple[str, float] = ("", 0.0)  # the resourceVersion last seen, and when it was first seen

    async def hold(self, api: Api) -> bool:
        """Take or renew the Lease; whether this replica holds it now."""
        # not asked again on a 429: the next renewal comes a third of the duration later, and a holder
        # waiting on the server's word could be taken over meanwhile
        status, lease = await api.call("GET", self.path, ok=(200, 404), retries=0)
        spec = self._spec()
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
            status, _ = await api.call("POST", self.path.rpartition("/")[0], body, ok=(201, 409), retries=0)
            self.holding = status == 201
            return self.holding
        meta, current = metadata(lease), mapping(lease.get("spec"))
        version = str(meta.get("resourceVersion") or "")
        if version != self._seen[0]:
            self._seen = (version, time.monotonic())
        holder = current.get("holderIdentity")
        duration = float(current.get("leaseDurationSeconds") or self.seconds)
        if holder not in (self.me, None, "") and time.monotonic() - self._seen[1] < duration:
            self.holding = False
            return False
        if holder != self.me:
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        else:
            spec["acquireTime"] = current.get("acquireTime") or spec["acquireTime"]
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0)
        body = {**lease, "spec": spec}
        status, _ = await api.call("PUT", self.path, body, ok=(200, 409), retries=0)
        self.holding = status == 200
        return self.holding

    def _spec(self) -> dict[str, Any]:
        """This replica as the holder, renewed now (and acquired now, unless it held it already)."""
        now = _now()
        return {"holderIdentity": self.me, "leaseDurationSeconds": int(self.seconds), "acquireTime": now,
                "renewTime": now}

    async def release(self, api: Api) -> None:
        """Let another replica take over at once (a clean shutdown), rather than after the duration."""
        if not self.holding:
            return
        self.holding = False
        status, lease = await api.call("GET", self.path, ok=(200, 404))
        if status == 200 and mapping(lease.get("spec")).get("holderIdentity") == self.me:
            await api.call("PUT", self.path, {**lease, "spec": {**lease["spec"], "holderIdentity": None}},
                           ok=(200, 409))


class EventLimit:
    """At most one Event per workload and finding every `every` seconds, and `per_pass` a pass."""

    def __init__(self, every: float, per_pass: int = EVENTS_PER_PASS) -> None:
        self.every, self.per_pass = every, per_pass
        self._sent: dict[tuple[str, str, str], float] = {}

    def due(self, results: Iterable[Result], now: float) -> list[Result]:
        """The results to send an Event for now, marked as sent."""
        self._sent = {k: t for k, t in self._sent.items() if now - t < self.every}
        out: list[Result] = []
        for r in results:
            key = (r.subject.uid or r.subject.label(), r.rule, r.message)
            if key in self._sent or len(out) >= self.per_pass:
                continue
            self._sent[key] = now
            out.append(r)
        return out


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
                async with session(info) as client:
                    api = Api(client, info.server, self._count)
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
        namespaces = [n async for page in api.pages("/api/v1/namespaces") for n in page]
        configurations = await self._configurations(api)
        try:
            auditing = Auditing(namespaces, configurations, self.state.view, self.state.config)
            workloads: list[Result] = []
            # Namespace by namespace: kube-apiserver's watch cache walks a list's whole key range from the
            # page's start for every page, so one cluster-wide list costs it the square of the pod count.
            for namespace in namespaces:
                path = f"/api/v1/namespaces/{quote(str(metadata(namespace).get('name') or ''))}/pods"
                async for page in _paced(api.pages(path, fieldSelector=LIVE_PODS)):
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
                out += [{**c, "kind": kind} async for page in api.pages(path) for c in page]
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
                    async for page in api.pages(path):
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
                    [r async for page in api.pages(f"{REPORTS}/{plural}", labelSelector=selector, limit="10")
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
                           _event(r, self.settings.me), ok=(201, 403, 404))


def _event(result: Result, me: str) -> Obj:
    """A Warning Event on the workload, where `kubectl describe` and event exporters look."""
    s: Subject = result.subject
    now = _now()
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{s.name}.", "namespace": s.namespace},
            "involvedObject": s.reference(), "type": "Warning", "reason": EVENT_REASONS[result.result],
            "message": clip(f"hami-mt-webhook audit: {result.message}", 1000),
            "source": {"component": "hami-mt-webhook"}, "reportingComponent": "hami-mt-webhook",
            "reportingInstance": me, "firstTimestamp": now[:19] + "Z", "lastTimestamp": now[:19] + "Z",
            "count": 1}


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
