"""The node view's feed: one streaming watch of Nodes, parsed a line at a time, swapped in whole.

Why not kopf's `kopf.index` + `kopf.on.event`, which fed the view before: at 10,000 real-sized
nodes (16 KB each) it took 793 s and 896 MiB to become ready. kopf gives every object a worker task
and a readiness toggle that wakes all the others (quadratic), deep-copies every body to keep a diff
base that only change handlers use (about 2 ms a node event), parses each relist whole on the event
loop (3 s with reviews waiting behind it), and keeps nodes that were deleted while it was
disconnected. The view needs about 200 bytes of a node, not 16 KB, and no per-object machinery.

So this module keeps kopf for what it does well (login, signals, the webhook server's lifecycle)
and reads Nodes itself:

- **WatchList** (Kubernetes 1.27+, on by default in current releases): one request,
  `watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true`, gives
  the complete set as ADDED events ended by a bookmark annotated `k8s.io/initial-events-end`, then
  goes on watching. No list body is ever held whole: each line is one node, parsed and reduced to
  a `NodeReport` at once, so peak memory follows the view, not the 172 MiB list.
- **Paged list + watch**, for servers before 1.27 or that refuse WatchList (`--node-watch list`
  forces it): `limit`/`continue` pages, then a watch from the list's resourceVersion.
- A set being (re)built goes into a fresh dict while the old view keeps answering; at the end of
  the initial events (or the last page) it replaces the view atomically, so nodes deleted while
  disconnected disappear and no review ever sees a half-built view.
- After a disconnect the watch resumes from the last resourceVersion seen; `410 Gone` (too old)
  starts a fresh build. Reconnects back off from 0.2 s to 2 s with jitter, so replicas do not
  relist in step and the view is current again within seconds of the API server returning.
- Work per line is bounded (one `orjson.loads` of one node and its report: about 35 µs for a 16 KB
  Node) and the loop is yielded to every 16 lines, so reviews never wait behind a relist. Parsing in
  a thread would not free the loop (orjson holds the GIL); a process would have to ship the view
  back, for no gain once each step is this small. The `hami_mt_webhook_node_work_seconds` histogram
  measures the longest wait.
- Once the view is current, reading **rests 0.2 s each time the stream has been drained**
  (`nodefeed.REST_SECONDS`): kubelet heartbeats then arrive about twenty to a read, one wakeup and
  one parser pass for all of them instead of one each. CPU of the watch alone at 100 node status
  updates/s of 15 KB Nodes on the local control plane (readers run side by side, so the figures
  move together with the machine's load): reading each event as it comes 4.1-5.2 % of a core,
  resting 0.2 s 1.9-3.3 %, 0.5 s 1.4-3.0 %. On uvloop, which `serve` used before, reading each
  event cost 6.0-7.1 %. 0.2 s keeps a change well within a second of the API. A large read means
  the stream is heavy (a mass update): then reading goes on without rest, so the API server, which
  closes watches that stop reading, never sees this one fall behind. A (re)build is read without
  rest.

Measured (`make bench BENCH_ARGS="--parts scale"`, 10,000 Nodes of about 15 KB): ready 3.4–6.2 s after
exec with a peak RSS of 82–89 MiB for the whole process, against 793 s and 896 MiB with kopf's index.

Readiness (`ready`) means the initial set has been applied once. While the watch is down later the
last view is still the best answer the webhook has (node capacities change rarely), so the replica
stays ready: pulling every replica out of the Service because the API server restarted would stop
all slice pod creation. The watch state and the view's age are metrics for an alert instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Mapping

import aiohttp
import kopf
import orjson

from .nodefeed import REST_SECONDS, Expired, Feed, WatchError, batches

logger = logging.getLogger("hami_mt_webhook")

NODES = "/api/v1/nodes"
#: Nodes per page in list mode: a page is parsed on the loop, so keep it to a few milliseconds.
PAGE_SIZE = 100
BACKOFF_START, BACKOFF_MAX = 0.2, 2.0
MODES = ("auto", "stream", "list")

Login = Callable[[], kopf.ConnectionInfo | None]


class Watch:
    """Keeps a `Feed` connected to the API server until cancelled: the objects `path` lists (`node_watch`,
    `quotawatch.quota_watch`), named `what` in logs."""

    def __init__(self, feed: Feed, login: Login, *, path: str, what: str, mode: str,
                 label_selector: str | None = None, watch_seconds: int = 300,
                 rest: float = REST_SECONDS) -> None:
        if mode not in MODES:
            raise ValueError(f"{what} mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.feed, self.login, self.mode = feed, login, mode
        self.path, self.what = path, what
        self.label_selector = label_selector
        self.watch_seconds = watch_seconds
        self.rest = rest
        self.connected = False
        self.started = time.time()
        self.relists = 0
        self.failures = 0
        self._metrics = feed.metrics
        if self._metrics is not None:
            self._metrics.watch_up.set_function(lambda: 1.0 if self.connected else 0.0)
            self._metrics.view_age.set_function(self.age)

    def age(self) -> float:
        """Seconds the view may be behind the API: 0 while the watch is up and synced."""
        if self.connected and self.feed.build is None and self.feed.synced_at is not None:
            return 0.0
        return time.time() - (self.feed.synced_at or self.started)

    async def run(self) -> None:
        delay = BACKOFF_START
        while True:
            info = self.login()
            if info is None:
                raise kopf.LoginError(f"no kubeconfig and no service account for the {self.what}")
            try:
                async with session(info) as client:
                    if self.mode == "auto":
                        self.mode = await _choose_mode(client, info.server, self.what)
                    while True:
                        await self._once(client, info.server)
                        # A watch that ended cleanly: reconnect at once.
                        delay, self.failures = BACKOFF_START, 0
            except asyncio.CancelledError:
                raise
            except Expired as err:
                logger.info("%s: %s; building the set anew", self.what, err)
                self.feed.resource_version = None
                delay = 0.0
            except (TimeoutError, WatchError, aiohttp.ClientError, OSError, ValueError) as err:
                if isinstance(err, WatchError) and err.status == 422 and self.mode == "stream":
                    logger.warning("%s: the API server refuses streaming lists (%s); using paged lists",
                                   self.what, err)
                    self.mode = "list"
                    delay = 0.0
                else:
                    self.failures += 1
                    # The first failure and then one a minute: an outage must not flood the log.
                    level = logging.WARNING if self.failures % 30 == 1 else logging.DEBUG
                    logger.log(level, "%s interrupted (%s: %s); retrying in %.1f s (failure %d in a row)",
                               self.what, type(err).__name__, err, delay, self.failures)
            finally:
                self.connected = False
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(max(delay * 2, BACKOFF_START), BACKOFF_MAX)

    async def keep_running(self) -> None:
        """`run`, restarted after anything it does not retry itself, so the view never freezes."""
        while True:
            try:
                await self.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("the %s failed; restarting it in 1 s", self.what)
                await asyncio.sleep(1.0)

    async def _once(self, session: aiohttp.ClientSession, server: str) -> None:
        """One watch request, preceded by a paged list when the set must be built in list mode."""
        feed = self.feed
        params = {"watch": "1", "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(int(self.watch_seconds * random.uniform(0.8, 1.0)))}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if feed.resource_version is None:
            self.relists += 1
            if self._metrics is not None:
                self._metrics.relists.inc()
            if self.mode == "list":
                await self._list(session, server)
                params["resourceVersion"] = feed.resource_version or ""
            else:
                feed.start_build()
                params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        else:
            params["resourceVersion"] = feed.resource_version
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.watch_seconds + 60)
        async with session.get(server + self.path, params=params, timeout=timeout) as resp:
            await _check(resp)
            self.connected, self.failures = True, 0
            if feed.build is None:
                feed.synced_at = time.time()
            async for batch in batches(resp.content, self._rest):
                started = time.perf_counter()
                for raw in batch:
                    feed.line(raw)
                self._turn_took(started)

    def _turn_took(self, started: float) -> None:
        """One turn of the loop spent on events without yielding, from `started` (perf_counter) to now."""
        if self._metrics is not None:
            self._metrics.node_work.observe(time.perf_counter() - started)

    def _rest(self) -> float:
        """Rest between reads only once the set is complete: a (re)build is read as fast as it comes."""
        return self.rest if self.feed.build is None else 0.0

    async def _list(self, session: aiohttp.ClientSession, server: str) -> None:
        self.feed.start_build()
        params = {"limit": str(PAGE_SIZE)}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        while True:
            async with session.get(server + self.path, params=params) as resp:
                await _check(resp)
                body = await resp.read()
            started = time.perf_counter()
            page = orjson.loads(body)
            for obj in page.get("items") or ():
                self.feed.apply("ADDED", obj)
            self._turn_took(started)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                self.feed.finish_build(meta.get("resourceVersion"))
                return
            params["continue"] = meta["continue"]
            await asyncio.sleep(0)


def node_watch(feed: Feed, login: Login, mode: str, label_selector: str | None = None) -> Watch:
    """The node view's watch: Nodes (those `label_selector` picks) into `feed`."""
    return Watch(feed, login, path=NODES, what="node watch", mode=mode, label_selector=label_selector)


async def _check(resp: aiohttp.ClientResponse) -> None:
    if resp.status == 200:
        return
    text = (await resp.text(errors="replace"))[:300]
    cls = Expired if resp.status == 410 else WatchError
    raise cls(f"HTTP {resp.status} from {resp.url.path}: {text}", resp.status)


def mode_for(major: int, minor: int) -> str:
    """The node view's way of reading for a Kubernetes version: a streaming list where the WatchList
    feature is on by default (1.32, and 1.34 on), paged lists where it is off (before 1.32, and 1.33,
    which turned it off again) and where servers ignore sendInitialEvents (before 1.27)."""
    return "stream" if (major, minor) == (1, 32) or (major, minor) >= (1, 34) else "list"


async def _choose_mode(session: aiohttp.ClientSession, server: str, what: str = "node watch") -> str:
    """`mode_for` the API server's version; an unreadable version streams, with paged lists as the
    fallback."""
    async with session.get(server + "/version", timeout=aiohttp.ClientTimeout(total=10)) as resp:
        await _check(resp)
        version = orjson.loads(await resp.read())
    try:
        major = int(str(version.get("major", "")).rstrip("+"))
        minor = int(str(version.get("minor", "")).rstrip("+"))
    except ValueError:
        return "stream"
    mode = mode_for(major, minor)
    logger.info("%s: Kubernetes %s.%s, %s", what, major, minor,
                "streaming list (WatchList)" if mode == "stream" else
                "paged list, then watch (WatchList is off by default in this version)")
    return mode


def session(info: kopf.ConnectionInfo) -> aiohttp.ClientSession:
    """A client of the API server as `info` logs in (also the peer watch's, for its status writes)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=info.as_ssl_context(), limit=2),
        headers={**info.as_http_headers(), "Accept": "application/json", "Accept-Encoding": "identity",
                 "User-Agent": "hami-mt-webhook"},
        trust_env=info.trust_env)


def login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo | None:
    """A kubeconfig when one is given (local runs), else the pod's service account; read afresh each
    time, so a rotated service-account token is picked up on the next reconnect.

    In a pod the API server is the address kubelet puts in the environment, as client-go's in-cluster
    config takes it, not kopf's `kubernetes.default.svc`: a name that needs the cluster's DNS, so a DNS
    outage (or a node without it) would leave every replica unready and every slice pod refused."""
    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is not None:
        return info
    info = kopf.login_with_service_account(settings=settings)
    server = in_cluster_server(os.environ)
    return dataclasses.replace(info, server=server) if info is not None and server else info


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """The API server's URL from `KUBERNETES_SERVICE_HOST` and `_PORT`, or None when either is unset."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
