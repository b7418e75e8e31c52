"""Quotas that count nothing (SPEC 4.9)."""

from __future__ import annotations

from ..audit.objects import ref
from ..rules.quota import limits_only_keys
from .model import Cluster, Finding, Settings

# --- quotas and existing pods ---------------------------------------------------------------------------

def quota(cluster: Cluster, settings: Settings) -> list[Finding]:
    """ResourceQuotas that limit slices only by `limits.` keys, which Kubernetes never counts (SPEC 4.9)."""
    found = []
    for q in cluster.quotas:
        keys = limits_only_keys(q, settings.config)
        if keys:
            twins = ", ".join(f"requests.{k.removeprefix('limits.')}" for k in keys)
            found.append(Finding("quota", f"ResourceQuota {ref(q)}",
                                 f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} never enforced: "
                                 f"Kubernetes counts extended resources by requests only; add {twins} with "
                                 "the same value (every slice pod has requests equal to limits, so it counts "
                                 "what the pod gets)"))
    return found
