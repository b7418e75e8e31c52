"""Quotas that count nothing, and slice pods admitted around the webhook."""

from __future__ import annotations

from ..audit.findings import FAIL, POD_HANDLER, scheduler_result
from ..audit.objects import name_of, namespace_of, ref
from ..audit.registrations import Modes
from ..rules.quota import limits_only_keys
from .model import Cluster, Finding, Settings, live_pods

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


def slice_pods(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Slice pods not on the configured scheduler: created before the webhook or while it was down, in a
    namespace the webhooks skip, or naming a retired scheduler. Each is listed with its fix; the audit's
    engine (`audit.findings.scheduler_result`) judges, as in the replicas' PolicyReports."""
    modes = Modes.of(cluster.mutating + cluster.validating, settings.config)
    namespaces = {name_of(n): n for n in cluster.namespaces}
    found = []
    for pod in live_pods(cluster):
        skipped = modes.mode(namespaces.get(namespace_of(pod), namespace_of(pod)), POD_HANDLER) is None
        result = scheduler_result(pod, skipped, settings.config)
        if result is not None:
            found.append(Finding("slice-pods", f"Pod {ref(pod)}", result.message, action=result.result == FAIL))
    return found
