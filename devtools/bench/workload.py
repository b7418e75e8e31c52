"""The benchmark's workload: a cluster of realistic GPU nodes and the five kinds of review of the mix."""

from __future__ import annotations

from typing import Any

from devtools.gpus import MODELS, ZONES, pod, review_body

PATH = "/mutate-pods"
KINDS = ("slice", "exclusive", "snap", "multi-card", "denied")
DESCRIBE = {
    "slice": "`vgpu 1, sgpu-memory 32, sgpu-core 8`: kept, requests = limits, scheduler set",
    "exclusive": "`vgpu 1` alone, nodeSelector MTT-S5000: filled to 160 / 16 (scans the nodes)",
    "snap": "`vgpu 1, sgpu-memory 20, sgpu-core 4`: snapped up to 32, with a warning",
    "multi-card": "`vgpu 2`, nodeSelector MTT-S5000: filled to 320 / 32, annotation (scans the nodes)",
    "denied": "`mthreads.com/gpu 1` and `vgpu 1` in one container: denied",
}
EXPECT = {"slice": "patched", "exclusive": "patched", "snap": "patched", "multi-card": "patched",
          "denied": "denied"}


def node(name: str, model: str, zone: str) -> dict[str, Any]:
    """A Node as `kubectl get node -o json` shows it, with the labels a GPU node usually carries."""
    m = MODELS[model]
    return m.node(name, m.datacenter_labels(name, zone),
                  **{"ephemeral-storage": "3750Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0"})


def cluster(s5000: int, s4000: int) -> list[dict[str, Any]]:
    """`s5000` nodes with eight 160-unit cards and `s4000` nodes with one 96-unit card, over three zones."""
    out = [node(f"s5000-{i:05d}", "S5000", ZONES[i % 3]) for i in range(s5000)]
    out += [node(f"s4000-{i:05d}", "S4000", ZONES[i % 3]) for i in range(s4000)]
    return out


def bodies() -> list[bytes]:
    """The five reviews of the mix, in KINDS order."""
    return [review_body(pod(kind), f"00000000-0000-4000-8000-{i:012d}") for i, kind in enumerate(KINDS)]


def outcome(decision: Any) -> str:
    if decision is None:
        return "error"
    if not decision.allowed:
        return "denied"
    return "patched" if decision.changes else "allowed"

