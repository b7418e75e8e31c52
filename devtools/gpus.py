"""The S4000/S5000 test cluster, defined once: the two card models, the nodes built from them, and the
training pod sent to them (`pod`, `review_body`: the benchmark's mix and the hostile clients' reviews).

An MTT S4000 node has one sliced card of 96 sgpu-memory units (48 GiB), an MTT S5000 node eight of
160 (80 GiB); each card has 16 sgpu-core. The unit tests (as NodeReports), `make run` and the
end-to-end tests (examples/nodes.yaml, checked against `example_nodes`), the benchmark and the fleet
of real-sized nodes all build their nodes from `MODELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

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
        return {WHOLE: str(self.cards), CORE: str(CORES_PER_CARD * self.cards),
                MEMORY: str(self.per_card * self.cards)}

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
                "mthreads.com/gpu-node": "true", PRODUCT: self.product,
                "mthreads.com/gpu.count": str(self.cards),
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


def pod(kind: str, name: str = "trainer", namespace: str = "bench", *, selector: bool | None = None,
        affinity: bool = False) -> dict[str, Any]:
    """A Pod as the API server hands it to admission (defaulted, requests copied from limits).

    `selector` overrides whether the pod pins MTT-S5000 with a nodeSelector; `affinity` pins it
    with a required nodeAffinity term instead.
    """
    slices: dict[str, str] = {
        "slice": {VGPU: "1", MEMORY: "32", CORE: "8"},
        "exclusive": {VGPU: "1"},
        "snap": {VGPU: "1", MEMORY: "20", CORE: "4"},
        "multi-card": {VGPU: "2"},
        "denied": {WHOLE: "1", VGPU: "1"},
    }[kind]
    main = {"cpu": "8", "memory": "32Gi", **slices}
    side = {"cpu": "100m", "memory": "128Mi"}
    common = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
              "imagePullPolicy": "IfNotPresent"}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "trainer", "image": "registry.example.com/mthreads/musa-pytorch:4.0.0-py311",
             "command": ["torchrun"],
             "args": ["--nproc-per-node=1", "train.py", "--config=/etc/train/config.yaml"],
             "ports": [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}],
             "env": [{"name": "MUSA_VISIBLE_DEVICES", "value": "all"},
                     {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                                     "fieldPath": "metadata.name"}}}],
             "resources": {"limits": dict(main), "requests": dict(main)},
             "volumeMounts": [{"name": "config", "mountPath": "/etc/train", "readOnly": True},
                              {"name": "data", "mountPath": "/data"}], **common},
            {"name": "log-shipper", "image": "registry.example.com/infra/fluent-bit:3.2",
             "resources": {"limits": dict(side), "requests": dict(side)},
             "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}], **common},
        ],
        "volumes": [{"name": "config", "configMap": {"name": "trainer-config", "defaultMode": 420}},
                    {"name": "data", "emptyDir": {}}],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
        "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300} for t in ("not-ready", "unreachable")],
    }
    if selector if selector is not None else kind in ("exclusive", "multi-card"):
        spec["nodeSelector"] = {PRODUCT: S5000.product}
    if affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": PRODUCT, "operator": "In", "values": [S5000.product]}]}]}}}
    metadata = {"name": name, "namespace": namespace, "labels": {"app": "trainer", "team": "ml-platform"},
                "annotations": {"bench.hami-mt/kind": kind}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review_body(obj: dict[str, Any], uid: str = "00000000-0000-4000-8000-000000000000") -> bytes:
    """An AdmissionReview v1 CREATE request for `obj`, shaped like kube-apiserver's."""
    meta = obj["metadata"]
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    request = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "name": meta.get("name"), "namespace": meta.get("namespace"), "operation": "CREATE",
               "userInfo": {"username": "system:serviceaccount:ml:trainer-controller",
                            "uid": "3f6c1a8e-7d1b-4c55-9f3a-2b8f5d6e7a10",
                            "groups": ["system:serviceaccounts", "system:serviceaccounts:ml",
                                       "system:authenticated"]},
               "object": obj, "oldObject": None, "dryRun": False,
               "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}
    return orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
