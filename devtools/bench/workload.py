"""The benchmark's workload: a cluster of realistic GPU nodes and the five kinds of review of the mix."""

from __future__ import annotations

from typing import Any

import orjson

from devtools.cluster import CORE, MEMORY, MODELS, PRODUCT, S5000, VGPU, WHOLE, ZONES

PATH = "/mutate-pods"
KINDS = ("slice", "exclusive", "snap", "multi-card", "denied")
DESCRIBE = {
    "slice": "`vgpu 1, sgpu-memory 32, sgpu-core 8`: kept, requests = limits, scheduler set",
    "exclusive": "`vgpu 1` alone, nodeSelector MTT-S5000: filled to 160 / 16 (scans the nodes)",
    "snap": "`vgpu 1, sgpu-memory 20, sgpu-core 4`: snapped up to 32, with a warning",
    "multi-card": "`vgpu 2`, nodeSelector MTT-S5000: filled to 320 / 32, annotation (scans the nodes)",
    "denied": "`mthreads.com/gpu 1` and `vgpu 1` in one container: denied",
}
EXPECT = {"slice": "patched", "exclusive": "patched", "snap": "patched", "multi-card": "patched", "denied": "denied"}


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
             "command": ["torchrun"], "args": ["--nproc-per-node=1", "train.py", "--config=/etc/train/config.yaml"],
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
                            "groups": ["system:serviceaccounts", "system:serviceaccounts:ml", "system:authenticated"]},
               "object": obj, "oldObject": None, "dryRun": False,
               "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}
    return orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})


def bodies() -> list[bytes]:
    """The five reviews of the mix, in KINDS order."""
    return [review_body(pod(kind), f"00000000-0000-4000-8000-{i:012d}") for i, kind in enumerate(KINDS)]


def outcome(decision: Any) -> str:
    if decision is None:
        return "error"
    if not decision.allowed:
        return "denied"
    return "patched" if decision.changes else "allowed"

