"""The pure part of the node view: watch events and list pages in, the view and its readiness kept up to date.

No I/O here: `nodewatch` reads the API server (with `watch.Watch`) and hands each line to `NodeFeed.line`,
which reduces a Node to its `NodeReport` at once, so a list body is never held whole.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from ...rules.capacity import ClusterView, NodeReport, OncePerNode, report
from ...rules.config import Config
from ..kube.watch import Build, Feed
from ..metrics import Metrics

logger = logging.getLogger("hami_mt_webhook")


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
