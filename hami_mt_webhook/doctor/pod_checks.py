"""Quotas that count nothing, and slice pods admitted around the webhook."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..admission.chart import flag_and_value
from ..rules.quota import limits_only_keys
from ..rules.selectors import selector_matches
from ..rules.shape import asks_for_slices
from .model import (
    MIGRATION,
    Cluster,
    Finding,
    Settings,
    live_pods,
    mapping,
    metadata,
    name_of,
    namespace_of,
    ref,
    registered,
    sequence,
    shipped_webhooks,
)

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


def _skipped(pod: Mapping[str, Any], namespaces: Mapping[str, Mapping[str, str]], selector: Any) -> bool:
    labels = dict(namespaces.get(namespace_of(pod), {}))
    labels.setdefault("kubernetes.io/metadata.name", namespace_of(pod))
    return not selector_matches(selector, labels)


def _recreate(pod: Mapping[str, Any]) -> str:
    owners = [mapping(o) for o in sequence(metadata(pod).get("ownerReferences"))]
    owner = next((o for o in owners if o.get("controller")), None)
    delete = f"kubectl -n {namespace_of(pod)} delete pod {name_of(pod)}"
    if owner:
        return (f"recreate it: {delete} (its {owner.get('kind')} {owner.get('name')} creates it again "
                "through the webhook)")
    return f"recreate it: {delete}, then create it again from its manifest"


def slice_pods(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Slice pods not on the configured scheduler: created before the webhook or while it was down, in a
    namespace the webhooks skip, or naming a retired scheduler. Each is listed with its fix."""
    config = settings.config
    mutating = next((hook for _, (kind, _doc, hook) in registered(cluster).items()
                     if kind == "MutatingWebhookConfiguration"), None)
    if mutating is None:
        mutating = next(hook for kind, _, hook in shipped_webhooks()
                        if kind == "MutatingWebhookConfiguration")
    selector = mutating.get("namespaceSelector")
    namespaces = {name_of(n): mapping(metadata(n).get("labels")) for n in cluster.namespaces}
    found = []
    for pod in live_pods(cluster):
        if not asks_for_slices(pod, config):
            continue
        name = mapping(pod.get("spec")).get("schedulerName") or "default-scheduler"
        if name == config.scheduler_name:
            continue
        where = f"Pod {ref(pod)}"
        if name in config.retired_schedulers:
            found.append(Finding("slice-pods", where,
                                 f"names scheduler {name}, which is retired (--retired-schedulers): "
                                 f"nothing will schedule it; {_recreate(pod)}, "
                                 "and remove schedulerName from its manifest"))
        elif name != "default-scheduler":
            found.append(Finding("slice-pods", where,
                                 f"asks for slices on scheduler {name}, which the webhook leaves alone: if "
                                 f"{name} does not account for HAMi's slices, {_recreate(pod)} without "
                                 f"schedulerName; once {name} no longer runs, list it in "
                                 f"{flag_and_value('--retired-schedulers')} ({MIGRATION})", action=False))
        elif _skipped(pod, namespaces, selector):
            found.append(Finding("slice-pods", where,
                                 f"asks for slices in namespace {namespace_of(pod)}, which the webhooks "
                                 "skip, so it is on default-scheduler, outside HAMi's accounting: run slice "
                                 "workloads in another namespace "
                                 "(docs/operating.md#who-may-switch-the-checks-off)"))
        else:
            found.append(Finding("slice-pods", where,
                                 "asks for slices on default-scheduler, outside HAMi's accounting (created "
                                 "before the webhook was installed, or while it was unreachable); "
                                 f"{_recreate(pod)}"))
    return found
