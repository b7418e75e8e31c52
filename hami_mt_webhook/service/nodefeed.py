"""The pure part of the node view: watch events and list pages in, the view and its readiness kept up to date.

No I/O here: `nodewatch` reads the API server and hands each line to `NodeFeed.line`, which reduces a
Node to its `NodeReport` at once, so a list body is never held whole.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from ..rules.capacity import ClusterView, NodeReport, OncePerNode, report
from ..rules.config import Config
from .metrics import Metrics

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


class WatchError(Exception):
    """The API server refused or broke the watch; `status` is its HTTP status or Status code, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Expired(WatchError):
    """The resourceVersion to resume from is gone (410): the set must be built anew."""


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


class NodeFeed(Feed):
    """Node events in, the node view (and its readiness) kept up to date."""

    def __init__(self, view: ClusterView, config: Config, metrics: Metrics | None = None) -> None:
        self.view, self.config, self.metrics = view, config, metrics
        self.resource_version: str | None = None
        self.build: Build | None = None
        self.synced_at: float | None = None
        # Nodes whose per-card capacity is no known card size, logged once (§2); forgotten when they go.
        self.noted = OncePerNode(logger, limit=None)
        #: Nodes that report sliced cores but no sliced card's capacity (the view leaves them out): name -> the
        #: sgpu-core and sgpu-memory they reported, for the audit's capacity findings.
        self.unreadable: dict[str, tuple[object, object]] = {}
        self._unreadable_build: dict[str, tuple[object, object]] | None = None

    def start_build(self) -> None:
        """A complete set starts arriving (initial events or a list); resume points are void until it ends."""
        self.build = Build()
        self._unreadable_build = {}
        self.resource_version = None
        logger.info("node view: reading the complete node set (%s)", "first sync" if not self.view.ready
                    else f"rebuild; {len(self.view)} sliced nodes keep answering meanwhile")

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """Apply one Node object: into the build while one is arriving, else straight into the view."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        node = report(obj, self.config) if kind != "DELETED" else None
        self._note(name, node)
        self._unreadable(kind, name, obj, node)
        if self.build is not None:
            self.build.apply(kind, name, node)
            return
        if node is None:
            self.view.remove(name)
        else:
            self.view.upsert(node)
        if self.metrics is not None:
            self.metrics.nodes.set(len(self.view))
            self.metrics.nonstandard.set(self.view.nonstandard(self.config))
            self.metrics.last_node_event.set(time.time())

    def _unreadable(self, kind: str, name: str, obj: dict[str, Any], node: NodeReport | None) -> None:
        """Keep aside a node that reports sliced cores the view cannot read (into the build while one arrives)."""
        into = self._unreadable_build if self.build is not None and self._unreadable_build is not None \
            else self.unreadable
        capacity = (obj.get("status") or {}).get("capacity") if node is None and kind != "DELETED" else None
        if isinstance(capacity, dict) and self.config.core in capacity:
            into[name] = (capacity[self.config.core], capacity.get(self.config.memory, 0))
        elif into:
            into.pop(name, None)

    def _note(self, name: str, node: NodeReport | None) -> None:
        """Log a node whose per-card capacity is no known card size once, not on every event (§2)."""
        if node is None or self.config.known_size(node.per_card):
            self.noted.forget(name)
            return
        self.noted.warn(name, f"node {name}: {node.per_card} units of {self.config.memory} per sliced card "
                              "is not a known card size (96, 160 or memoryPerCard): its report likely "
                              "includes the vendor's overcommit_ratio; fills use it as reported")

    def finish_build(self, resource_version: str | None) -> None:
        """The set is complete: it replaces the view whole, and the view is ready."""
        assert self.build is not None
        nodes, self.build = self.build.nodes, None
        self.unreadable, self._unreadable_build = self._unreadable_build or {}, None
        self.noted.keep(nodes)  # nodes deleted while the watch was away: a new one of the name is logged
        self.view.replace(nodes)
        del nodes
        # The view lives until the next rebuild and holds no cycles: keep it (and everything loaded so
        # far) out of the cyclic collector, whose full passes otherwise stop the loop for 40-60 ms.
        gc.freeze()
        self.resource_version = resource_version or None
        first = not self.view.ready
        self.view.ready = True
        self.synced_at = time.time()
        if self.metrics is not None:
            self.metrics.ready.set(1)
            self.metrics.nodes.set(len(self.view))
            self.metrics.nonstandard.set(self.view.nonstandard(self.config))
            self.metrics.last_node_event.set(self.synced_at)
        logger.info("node view %s: %d sliced nodes", "synced" if first else "rebuilt", len(self.view))


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
