"""Nodes: per-card capacity, cards reported both whole and sliced, the labels selectors need."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..admission.chart import flag_and_value
from ..audit.objects import mapping, metadata, name_of, ref, sequence
from ..rules.capacity import ClusterView, NodeReport, report
from ..rules.quantities import QuantityError, whole
from ..rules.shape import asks_for_slices
from .model import (
    CARD_COUNT_LABEL,
    NODE_IDENTITY_LABELS,
    Cluster,
    Finding,
    Settings,
    counted,
    live_pods,
    node_reports,
)

# --- nodes -------------------------------------------------------------------------------------------------

def _taints(node: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in (mapping(x) for x in sequence(mapping(node.get("spec")).get("taints")))}


def whole_and_sliced(cluster: Cluster, settings: Settings) -> list[Finding]:
    """A node offering the same cards as whole cards and as slices: two schedulers can hand out one card."""
    config = settings.config
    found = []
    for node in cluster.nodes:
        r = report(node, config)
        if r is None:
            continue
        caps = mapping(mapping(node.get("status")).get("capacity"))
        whole_cards, names = 0, []
        for res in config.whole_card:
            try:
                n = whole(caps[res]) if res in caps else 0
            except QuantityError:
                n = 0
            if n > 0:
                whole_cards += n
                names.append(res)
        if not whole_cards:
            continue
        label = mapping(metadata(node).get("labels")).get(CARD_COUNT_LABEL)
        count = int(label) if isinstance(label, str) and label.isascii() and label.isdigit() else None
        if count is not None and whole_cards + r.cards <= count:
            continue
        if config.sliced_node_taint is not None and config.sliced_node_taint in _taints(node):
            continue  # whole-card pods are kept off, slice pods tolerate it
        on = f" on a node of {counted(count, 'card')} ({CARD_COUNT_LABEL})" if count is not None else ""
        found.append(Finding("whole-and-sliced", f"Node {name_of(node)}",
                             f"reports {counted(whole_cards, 'whole card')} ({', '.join(names)}) and "
                             f"{counted(r.cards, 'sliced card')}{on}: the same cards may go to a whole-card "
                             "pod (default-scheduler) and to slices (hami-scheduler) at once, and neither "
                             "scheduler sees the other; slice a fixed subset of the cards (gpu_ids), or "
                             f"taint the node and run the webhook with {flag_and_value('--sliced-node-taint')}, "
                             "as docs/mixed-clusters.md#whole-cards-and-slices-on-one-node says"))
    return found


def _separates(key: str, reports: list[NodeReport]) -> bool:
    """Every node carries `key`, and its values map one to one onto the card sizes."""
    by_value: dict[str, set[int]] = {}
    by_size: dict[int, set[str]] = {}
    for r in reports:
        if key not in r.labels:
            return False
        value = str(r.labels[key])
        by_value.setdefault(value, set()).add(r.per_card)
        by_size.setdefault(r.per_card, set()).add(value)
    return all(len(v) == 1 for v in by_value.values()) and all(len(v) == 1 for v in by_size.values())


def labels(cluster: Cluster, settings: Settings) -> list[Finding]:
    """The labels selectors need: one telling card models apart in a mixed cluster, and slice pods whose
    selector matches no sliced node (judged against --memory-per-card, and never scheduled)."""
    config = settings.config
    reports = node_reports(cluster, config)
    found = []
    sizes = sorted({r.per_card for r in reports})
    if len(sizes) > 1:
        keys = {k for r in reports for k in r.labels} - NODE_IDENTITY_LABELS
        if not any(_separates(k, reports) for k in sorted(keys)):
            found.append(Finding("labels", "Nodes",
                                 f"sliced nodes have cards of {', '.join(map(str, sizes))} units, but no "
                                 "node label tells the models apart: a pod cannot pin a card model, and "
                                 "whole-card fills take the largest; label the nodes one value per model "
                                 "(kubectl label node <name> example.com/gpu-model=S5000) and pin with a "
                                 "nodeSelector (docs/mixed-clusters.md#pinning-a-model)"))
    if not reports:
        return found
    view = ClusterView(reports)
    for pod in live_pods(cluster):
        spec = mapping(pod.get("spec"))
        if not asks_for_slices(pod, config) or spec.get("nodeName"):
            continue
        node_affinity = mapping(mapping(spec.get("affinity")).get("nodeAffinity"))
        constrained = (spec.get("nodeSelector")
                       or node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
        if constrained and not view.candidates(spec, config).from_nodes:
            found.append(Finding("labels", f"Pod {ref(pod)}",
                                 "its nodeSelector or required node affinity matches none of the "
                                 f"{len(reports)} sliced nodes: it was filled and checked against "
                                 "--memory-per-card and no sliced node will take it; fix the selector or the "
                                 "node labels (kubectl get nodes --show-labels), then recreate the pod"))
    return found
