"""SPEC.md §4.9: ResourceQuotas on slice resources written with `limits.` keys, which nothing enforces.

HAMi's own quota support reads `limits.mthreads.com/sgpu-memory`; Kubernetes counts extended resources
in a ResourceQuota only under `requests.` keys (it accepts a `limits.` key and never enforces it). A
cluster moving from HAMi's webhook to this one would lose such a quota silently, so the webhook warns
at admission. Since slice pods' requests equal their limits, the `requests.` key counts the same.

Pure: the service keeps a `QuotaIndex` from a ResourceQuota watch; `warnings` judges one pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import Config
from .shape import asks_for_slices
from .text import quote

__all__ = ["QuotaIndex", "limits_only_keys", "unenforced_keys", "warnings"]

LIMITS, REQUESTS = "limits.", "requests."


def unenforced_keys(quota: Any, config: Config) -> frozenset[str]:
    """The `limits.<slice resource>` keys of a ResourceQuota's spec.hard with no `requests.` twin (nor the
    bare name, which means the same): those count nothing. None for anything that is not a quota."""
    spec = quota.get("spec") if isinstance(quota, dict) else None
    hard = spec.get("hard") if isinstance(spec, dict) else None
    if not isinstance(hard, dict):
        return frozenset()
    return frozenset(k for k in hard if isinstance(k, str) and k.startswith(LIMITS)
                     and (name := k[len(LIMITS):]) in config.slices
                     and REQUESTS + name not in hard and name not in hard)


def limits_only_keys(quota: Any, config: Config) -> list[str]:
    """`unenforced_keys` in the order the slice resources are listed (what `doctor` reports)."""
    keys = unenforced_keys(quota, config)
    return [LIMITS + name for name in config.slices if LIMITS + name in keys]


def warnings(pod: Any, quotas: Mapping[str, frozenset[str]], config: Config) -> list[str]:
    """One warning per unenforced key of the pod's namespace (`quotas`: quota name -> its keys),
    for a pod that asks for slices; none otherwise."""
    if not quotas or not asks_for_slices(pod, config):
        return []
    return [f"ResourceQuota {quote(name)} sets {key}, which is not enforced by Kubernetes: write "
            f"{REQUESTS}{key[len(LIMITS):]} (slice pods' requests equal their limits, so it counts the same)"
            for name in sorted(quotas) for key in sorted(quotas[name])]


class QuotaIndex:
    """Namespace -> ResourceQuota name -> its unenforced keys, for the quotas that have any.

    Only those are kept, so memory follows the few such quotas, not every quota in the cluster.
    """

    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, frozenset[str]]] = {}
        self.ready = False

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_namespace.values())

    def get(self, namespace: str) -> Mapping[str, frozenset[str]]:
        return self._by_namespace.get(namespace, {})

    def set(self, namespace: str, name: str, keys: frozenset[str]) -> None:
        """Record a quota's keys; a quota without any is forgotten."""
        if keys:
            self._by_namespace.setdefault(namespace, {})[name] = keys
            return
        quotas = self._by_namespace.get(namespace)
        if quotas is not None:
            quotas.pop(name, None)
            if not quotas:
                del self._by_namespace[namespace]

    def replace(self, entries: Mapping[tuple[str, str], frozenset[str]]) -> None:
        """Swap in a complete set (a relist): quotas absent from it are gone."""
        fresh: dict[str, dict[str, frozenset[str]]] = {}
        for (namespace, name), keys in entries.items():
            if keys:
                fresh.setdefault(namespace, {})[name] = keys
        self._by_namespace = fresh
