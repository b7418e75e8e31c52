"""The quota index's feed (SPEC.md §4.9): ResourceQuotas through the node watch's machinery.

The same streaming watch as Nodes (`kube.watch.Watch`: WatchList or paged lists, resume, 410,
back-off), on /api/v1/resourcequotas. Of each quota only its `limits.` slice keys are kept, and only
for quotas that have any, so the index stays a few bytes per such quota. The warning it feeds is
advisory: readiness does not wait for it, and while it is not synced no warning is given.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ...rules.config import Config
from ...rules.quota import QuotaIndex, unenforced_keys
from ..kube.client import Login
from ..kube.watch import Feed, Watch

logger = logging.getLogger("hami_mt_webhook")

QUOTAS = "/api/v1/resourcequotas"


class QuotaFeed(Feed):
    """ResourceQuota events in, the `QuotaIndex` kept up to date."""

    def __init__(self, index: QuotaIndex, config: Config) -> None:
        self.index, self.config = index, config

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """Apply one ResourceQuota: its unenforced `limits.` keys, into the build or the index."""
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        keys = frozenset() if kind == "DELETED" else unenforced_keys(obj, self.config)
        if self.build is not None:
            self.build.apply(kind, "/".join(key), keys or None)
            return
        self.index.set(*key, keys)

    def finish_build(self, resource_version: str | None) -> None:
        assert self.build is not None
        entries, self.build = self.build.nodes, None
        quotas: dict[tuple[str, str], frozenset[str]] = {}
        for key, keys in entries.items():
            namespace, _, name = key.partition("/")  # a namespace name has no "/"
            quotas[(namespace, name)] = keys
        self.index.replace(quotas)
        self.resource_version = resource_version or None
        self.index.ready = True
        self.synced_at = time.time()
        logger.info("quota watch synced: %d ResourceQuotas with limits. keys on slice resources "
                    "(not enforced by Kubernetes; pods in their namespaces are warned)", len(self.index))


def quota_watch(index: QuotaIndex, config: Config, login: Login, mode: str) -> Watch:
    """The quota index's watch, started beside the node watch with the same way of reading."""
    return Watch(QuotaFeed(index, config), login, path=QUOTAS, what="quota watch", mode=mode)
