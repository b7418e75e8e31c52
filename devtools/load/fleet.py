"""Node objects shaped like the ones kubelets report on a GPU cluster, and a fast way to create them.

The scale benchmark and the node-view tests need thousands of Nodes that cost what real ones cost:
about 16 KB each as the API returns them (13 labels, 5 conditions, 40 images, nodeInfo, a taint,
kubelet's managed fields), two thirds S5000 and one third S4000 (the models of devtools.gpus).
They are created the way kubelet does it: the Node, then its status subresource.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ssl
from collections.abc import Iterable
from typing import Any

import aiohttp
import orjson

from devtools.gpus import S4000, S5000, ZONES, Model

CONDITIONS = (("MemoryPressure", "False", "KubeletHasSufficientMemory"),
              ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
              ("PIDPressure", "False", "KubeletHasSufficientPID"),
              ("NetworkUnavailable", "False", "RouteCreated"),
              ("Ready", "True", "KubeletReady"))
IMAGES = ("musa-runtime", "pytorch-musa", "vllm-musa", "triton-musa", "mt-device-plugin",
          "hami-device-plugin", "kube-proxy", "calico-node", "node-exporter", "dcgm-exporter", "fluent-bit",
          "coredns", "pause", "nccl-tests", "mccl-tests", "jupyter-musa", "ray-musa", "deepspeed-musa",
          "megatron-musa", "mpi-operator")


def model_of(i: int) -> Model:
    """Two thirds S5000, one third S4000."""
    return S4000 if i % 3 == 2 else S5000


def name_of(i: int) -> str:
    return f"gpu-{model_of(i).name.lower()}-{i:05d}"


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def node(i: int, *, heartbeat: str = "2026-12-01T08:00:00Z") -> dict[str, Any]:
    """Node number `i` of the fleet, as kubelet registers it (metadata and spec, then status)."""
    model = model_of(i)
    cards = model.cards
    name = name_of(i)
    zone = ZONES[i % len(ZONES)]
    images = []
    for k in range(40):
        repo = f"registry.cn-north-1.example.com/mthreads-ai-platform/{IMAGES[k % len(IMAGES)]}"
        tag = f"v{1 + k // len(IMAGES)}.{(i + k) % 7}.{k % 5}"
        images.append({"names": [f"{repo}@sha256:{_digest(repo, tag)}", f"{repo}:{tag}"],
                       "sizeBytes": 50_000_000 + 7_919 * k * (1 + i % 13)})
    capacity = {"cpu": model.cpu,
                "memory": "1056887436Ki" if cards > 1 else "528443718Ki",  # kubelet counts KiB
                "pods": "110", "ephemeral-storage": "3843516548Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", **model.capacity()}
    allocatable = {**capacity, "cpu": "127500m" if cards > 1 else "63500m",
                   "memory": "1056270000Ki" if cards > 1 else "527800000Ki"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**model.datacenter_labels(name, zone), "node-role.kubernetes.io/gpu": ""},
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": orjson.dumps({"csi.example.com": name}).decode(),
                "projectcalico.org/IPv4Address": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}/16"},
        },
        "spec": {"podCIDR": f"10.{128 + i // 256 % 128}.{i % 256}.0/24",
                 "podCIDRs": [f"10.{128 + i // 256 % 128}.{i % 256}.0/24"],
                 "providerID": f"example://cn-north/{zone}/{_digest(name)[:16]}",
                 "taints": [{"key": "mthreads.com/gpu", "value": "present", "effect": "PreferNoSchedule"}]},
        "status": {
            "capacity": capacity, "allocatable": allocatable,
            "conditions": conditions(heartbeat),
            "addresses": [{"type": "InternalIP",
                           "address": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": _digest("machine", i)[:32], "systemUUID": _digest("uuid", i)[:32],
                         "bootID": _digest("boot", i)[:32], "kernelVersion": "5.15.0-119-generic",
                         "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                         "kubeletVersion": "v1.37.2", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": images,
        },
    }


def conditions(heartbeat: str) -> list[dict[str, str]]:
    return [{"type": t, "status": s, "reason": r, "message": f"kubelet reports {r}",
             "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-11-01T08:00:00Z"}
            for t, s, r in CONDITIONS]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def admin_context(cp: Any) -> ssl.SSLContext:
    """TLS to a devtools.clusters.controlplane.ControlPlane as its admin: its CA, the admin client certificate."""
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.load_cert_chain(str(cp.workdir / "admin.crt"), str(cp.workdir / "admin.key"))
    return ctx


def session(server: str, context: ssl.SSLContext, connections: int = 32) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=server,
                                 connector=aiohttp.TCPConnector(ssl=context, limit=connections),
                                 headers={"Accept-Encoding": "identity"})


async def create(s: aiohttp.ClientSession, numbers: Iterable[int], concurrency: int = 32) -> None:
    """Create the Nodes and then set their status through the subresource, as kubelet registers."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        obj = node(i)
        body = {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        async with gate:
            async with s.post("/api/v1/nodes", data=orjson.dumps(body),
                              headers={"Content-Type": "application/json"}) as r:
                if r.status not in (201, 409):
                    raise RuntimeError(f"creating node {obj['metadata']['name']}: HTTP {r.status} "
                                       f"{await r.text()}")
            await set_status(s, obj["metadata"]["name"], obj["status"])

    await asyncio.gather(*(one(i) for i in numbers))


async def set_status(s: aiohttp.ClientSession, name: str, status: dict[str, Any]) -> None:
    async with s.patch(f"/api/v1/nodes/{name}/status", data=orjson.dumps({"status": status}),
                       headers={"Content-Type": "application/strategic-merge-patch+json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"patching node {name}/status: HTTP {r.status} {await r.text()}")
        await r.read()


async def heartbeat(s: aiohttp.ClientSession, i: int) -> None:
    """What a kubelet sends every few seconds: the conditions with a new heartbeat time."""
    await set_status(s, name_of(i), {"conditions": conditions(now())})
