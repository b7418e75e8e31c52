"""The S4000/S5000 test cluster, defined once: the two card models and the nodes built from them.

An MTT S4000 node has one sliced card of 96 sgpu-memory units (48 GiB), an MTT S5000 node eight of
160 (80 GiB); each card has 16 sgpu-core. The unit tests (as NodeReports), `make run` and the
end-to-end tests (examples/nodes.yaml, checked against `example_nodes`), the benchmark and the fleet
of real-sized nodes all build their nodes from `MODELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hami_mt_webhook.rules.capacity import NodeReport, report
from hami_mt_webhook.rules.config import CORES_PER_CARD, Config

CONFIG = Config()
VGPU, MEMORY, CORE = CONFIG.slices
WHOLE = CONFIG.whole_card[0]
PRODUCT = "mthreads.com/gpu.product"
HOSTNAME = "kubernetes.io/hostname"
ZONES = ("cn-north-1a", "cn-north-1b", "cn-north-1c")


@dataclass(frozen=True)
class Model:
    """One GPU node model: its product label, sliced cards, sgpu-memory per card, and the host around them."""

    name: str  # "S4000"
    product: str  # the value of the product label
    cards: int
    per_card: int  # sgpu-memory units (512 MiB) per card
    cpu: str
    memory: str

    @property
    def selector(self) -> dict[str, str]:
        """The nodeSelector that pins a pod to this model."""
        return {PRODUCT: self.product}

    def capacity(self) -> dict[str, str]:
        """The GPU part of the node's capacity, as the device plugin reports it."""
        return {WHOLE: str(self.cards), CORE: str(CORES_PER_CARD * self.cards), MEMORY: str(self.per_card * self.cards)}

    def labels(self, name: str) -> dict[str, str]:
        """The labels of examples/nodes.yaml: the hostname, the GPU node mark, the product, the card count."""
        return {HOSTNAME: name, "mthreads.com/gpu-node": "true", PRODUCT: self.product,
                "mthreads.com/gpu.count": str(self.cards)}

    def datacenter_labels(self, name: str, zone: str) -> dict[str, str]:
        """The labels a node of a real GPU cluster carries: kubelet's, the cloud's, the GPU operator's."""
        return {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", HOSTNAME: name,
                "node.kubernetes.io/instance-type": f"mtt-{self.name.lower()}-x{self.cards}",
                "topology.kubernetes.io/region": "cn-north", "topology.kubernetes.io/zone": zone,
                "mthreads.com/gpu-node": "true", PRODUCT: self.product, "mthreads.com/gpu.count": str(self.cards),
                "mthreads.com/driver-version": "3.1.0"}

    def node(self, name: str, labels: dict[str, str] | None = None, **capacity: str) -> dict[str, Any]:
        """A Node as `kubectl get node -o yaml` shows it (metadata and capacity); `capacity` adds to it."""
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": self.labels(name) if labels is None else labels},
                "status": {"capacity": {"cpu": self.cpu, "memory": self.memory, "pods": "110", **capacity,
                                        **self.capacity()}}}

    def report(self, name: str) -> NodeReport:
        """What the rules read of `node(name)`."""
        got = report(self.node(name), CONFIG)
        assert got is not None, f"{self} is not a sliced node"
        return got


S4000 = Model("S4000", "MTT-S4000", cards=1, per_card=96, cpu="64", memory="512Gi")
S5000 = Model("S5000", "MTT-S5000", cards=8, per_card=160, cpu="128", memory="1Ti")
MODELS = {m.name: m for m in (S4000, S5000)}


def example_nodes() -> list[dict[str, Any]]:
    """The nodes of examples/nodes.yaml: one of each model, named after it."""
    return [m.node(f"{m.name.lower()}-node") for m in (S4000, S5000)]


def whole_card_node() -> dict[str, Any]:
    """A node with eight whole cards and no slices: what the webhook must leave alone."""
    name = "whole-card-node"
    return {"metadata": {"name": name, "labels": {PRODUCT: S4000.product, HOSTNAME: name}},
            "status": {"capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", WHOLE: "8"}}}
