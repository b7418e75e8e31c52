"""ResourceQuota keys for the slice resources (SPEC 4.9)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import Config


def limits_only_keys(quota: Mapping[str, Any], config: Config) -> list[str]:
    """The `limits.<slice resource>` keys of a ResourceQuota's `spec.hard` that have no `requests.` twin.

    HAMi writes its quotas with `limits.` keys, but Kubernetes counts only `requests.` (or the bare name)
    for extended resources, so such a key is accepted and never enforced.
    """
    hard = ((quota.get("spec") or {}).get("hard") or {}) if isinstance(quota, Mapping) else {}
    if not isinstance(hard, Mapping):
        return []
    return [f"limits.{name}" for name in config.slices
            if f"limits.{name}" in hard and f"requests.{name}" not in hard and name not in hard]
