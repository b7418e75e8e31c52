"""A watch of one kind of object, as every watch of the replica runs it: one streaming request (WatchList,
`watch=1&sendInitialEvents=true`) or paged lists and then a watch, resumed from the last resourceVersion seen,
built anew on 410, reconnecting with jittered backoff, read a bounded batch of lines per turn of the loop; and
it reaches the API server through `client.Api`. What a watch does with each object is its `Feed`'s: the node
view's (`watches.nodefeed.NodeFeed`), the quota watch's, the peer watch's. `watches.nodewatch` says why this is
not kopf's watch, and what it measured at 10,000 nodes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf
import orjson

from ..metrics import Metrics
from .client import Api, ApiError, Expired, Login

logger = logging.getLogger("hami_mt_webhook")

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


#: Yield to the loop after this many lines even if more are already buffered.
LINES_PER_TURN = 16


#: The longest line (one Node) accepted from a watch; a real Node is about 16 KB.
MAX_LINE = 8 * 1024 * 1024


#: Once the view is current, reading rests this long each time the stream has been drained, so that
#: kubelet heartbeats are parsed about twenty at a time instead of waking the reader once each
#: (nodewatch's docstring has the figures). A change reaches the view at most this much later.
REST_SECONDS = 0.2


#: A read at least this large means more is already waiting: read on without resting, so that a heavy
#: stream never backs up into the API server, which closes a watch that stops reading.
CAUGHT_UP = 64 * 1024


class WatchError(ApiError):
    """The watch's stream broke: an unreadable event, or one the API server ended it with."""


@dataclass
class Build:
    """A set of nodes being built from initial events or list pages, not yet visible to reviews."""

    nodes: dict[str, Any] = field(default_factory=dict)  # name -> what the view keeps of the object

    def apply(self, kind: str, name: str, node: Any) -> None:
        if kind == "DELETED" or node is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = node


class Feed:
    """The pure part of a watch: events in, a view (and its readiness) kept up to date.

    It holds the resourceVersion to resume from, and a `Build` while a complete set is arriving.
    Subclasses say what one object does to their view (`apply`) and how a complete set replaces it.
    """

    resource_version: str | None = None
    build: Build | None = None
    synced_at: float | None = None  # wall time the view was last known complete and current
    metrics: Metrics | None = None

    def start_build(self) -> None:
        """A complete set starts arriving (initial events or a list); resume points are void until it ends."""
        self.build = Build()
        self.resource_version = None

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """Apply one object of an ADDED, MODIFIED or DELETED event, or of a list page."""
        raise NotImplementedError

    def finish_build(self, resource_version: str | None) -> None:
        raise NotImplementedError

    def line(self, raw: bytes) -> None:
        """One watch event, as the API server sends it (a JSON object)."""
        try:
            event = orjson.loads(raw)
            kind = event["type"]
            obj = event["object"]
            meta = obj.get("metadata") or {}
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise WatchError(f"unreadable watch event ({err})") from None
        if kind == "ERROR":
            code = obj.get("code")
            message = f"the watch ended with an error: {obj.get('message') or obj}"
            if code == 410:
                raise Expired(message, 410)
            raise WatchError(message, code if isinstance(code, int) else None)
        rv = meta.get("resourceVersion")
        if kind == "BOOKMARK":
            if self.build is not None and (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                self.finish_build(rv)
            elif self.build is None and rv:
                self.resource_version = rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        self.apply(kind, obj)
        if self.build is None and rv:
            self.resource_version = rv


def _never() -> float:
    return 0.0


async def batches(content: aiohttp.StreamReader,
                  rest: Callable[[], float] = _never) -> AsyncIterator[list[bytes]]:
    """Split a watch stream into lines, at most LINES_PER_TURN at a time, without any line limit of
    the reader (a Node can be large). The caller handles a batch between two turns of the loop.

    After a small read (the stream is drained) reading rests for `rest()` seconds, so that what
    arrives meanwhile is taken as one read. The transport is not paused for it: aiohttp's own flow
    control does that once its buffer is full, and pausing an SSL transport by hand stalled the
    stream in trials."""
    pending = b""
    async for chunk in content.iter_any():
        pending += chunk
        if b"\n" not in chunk:
            if len(pending) > MAX_LINE:
                raise WatchError(f"a watch event is longer than {MAX_LINE} bytes")
            continue
        *complete, pending = pending.split(b"\n")
        complete = [line for line in complete if line]
        for i in range(0, len(complete), LINES_PER_TURN):
            yield complete[i:i + LINES_PER_TURN]
            await asyncio.sleep(0)
        if len(chunk) < CAUGHT_UP and (seconds := rest()) > 0:
            await asyncio.sleep(seconds)
    if pending.strip():
        yield [pending]


#: Nodes per page in list mode: a page is parsed on the loop, so keep it to a few milliseconds.
PAGE_SIZE = 100


BACKOFF_START, BACKOFF_MAX = 0.2, 2.0


MODES = ("auto", "stream", "list")


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
                async with Api.open(info) as api:
                    if self.mode == "auto":
                        self.mode = await _choose_mode(api, self.what)
                    while True:
                        await self._once(api)
                        # A watch that ended cleanly: reconnect at once.
                        delay, self.failures = BACKOFF_START, 0
            except asyncio.CancelledError:
                raise
            except Expired as err:
                logger.info("%s: %s; building the set anew", self.what, err)
                self.feed.resource_version = None
                delay = 0.0
            except (TimeoutError, ApiError, aiohttp.ClientError, OSError, ValueError) as err:
                if isinstance(err, ApiError) and err.status == 422 and self.mode == "stream":
                    logger.warning("%s: the API server refuses streaming lists (%s); using paged lists",
                                   self.what, err)
                    self.mode = "list"
                    delay = 0.0
                else:
                    self.failures += 1
                    if isinstance(err, ApiError) and err.retry_after is not None:
                        delay = err.retry_after  # the server said when to come back (client-go's rule)
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

    async def _once(self, api: Api) -> None:
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
                await self._list(api)
                params["resourceVersion"] = feed.resource_version or ""
            else:
                feed.start_build()
                params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        else:
            params["resourceVersion"] = feed.resource_version
        async with api.stream(self.path, params, read_timeout=self.watch_seconds + 60) as content:
            self.connected, self.failures = True, 0
            if feed.build is None:
                feed.synced_at = time.time()
            async for batch in batches(content, self._rest):
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

    async def _list(self, api: Api) -> None:
        self.feed.start_build()
        params = {"limit": str(PAGE_SIZE)}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        while True:
            _, body = await api.request("GET", self.path, params=params, ok=(200,))
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


def mode_for(major: int, minor: int) -> str:
    """The node view's way of reading for a Kubernetes version: a streaming list where the WatchList
    feature is on by default (1.32, and 1.34 on), paged lists where it is off (before 1.32, and 1.33,
    which turned it off again) and where servers ignore sendInitialEvents (before 1.27)."""
    return "stream" if (major, minor) == (1, 32) or (major, minor) >= (1, 34) else "list"


async def _choose_mode(api: Api, what: str = "node watch") -> str:
    """`mode_for` the API server's version; an unreadable version streams, with paged lists as the
    fallback."""
    _, version = await api.call("GET", "/version", ok=(200,), timeout=10)
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
