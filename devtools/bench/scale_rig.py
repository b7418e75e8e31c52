"""The scale part's rig: the control plane, the webhook and the clients of one run, and its measurements
(pods at a steady rate with or without node churn, capacity changes, an API server restart)."""

from __future__ import annotations

import asyncio
import base64
import math
import random
import secrets
import ssl
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from devtools import procs
from devtools.bench.apiserver import webhook_latency
from devtools.bench.report import Histogram, histograms
from devtools.gpus import MEMORY, S5000, VGPU
from devtools.load import fleet
from devtools.waiting import until_async


def usage(pid: int) -> dict[str, float]:
    """CPU seconds, current and peak RSS (MiB) of a process, from /proc."""
    memory = procs.memory_mib(pid)
    return {"cpu": procs.cpu_seconds(pid), "rss": memory.get("VmRSS", math.nan),
            "peak": memory.get("VmHWM", math.nan)}


@dataclass
class Pods:
    """Pods created through the API server at a steady rate; connection errors and the API server's own
    unavailability (it is being restarted) are retried, as a controller would."""

    created: int = 0
    failed: list[str] = field(default_factory=list)
    retried: int = 0
    client_ms: list[float] = field(default_factory=list)
    #: When each of `client_ms` was sent (Unix time): slow ones set against what else ran then.
    client_at: list[float] = field(default_factory=list)


class Rig:
    """The control plane, the webhook and the clients of one scale run."""

    def __init__(self, cp: Any, hook: Any, api: aiohttp.ClientSession) -> None:
        self.cp, self.hook, self.api = cp, hook, api
        self.ns = f"scale-{secrets.token_hex(3)}"
        self.count = 0
        self.webhook_ctx = ssl.create_default_context(cafile=str(hook.certs.bundle))

    async def api_metrics(self) -> str:
        """The API server's /metrics (it may be restarting: 10 s, the 50 tries 0.2 s apart this gave before)."""
        async def answer() -> str | None:
            try:
                async with self.api.get("/metrics") as r:
                    return await r.text() if r.status == 200 else None
            except aiohttp.ClientError:
                return None

        return await until_async("the API server's /metrics answering", answer, 10, 0.2)

    async def pods(self, rate: float, seconds: float, out: Pods) -> None:
        """Create `rate` pods a second for `seconds`, each an exclusive slice pod (mutated by the webhook)."""
        started = time.perf_counter()
        tasks = []
        i = 0
        while (due := started + i / rate) < started + seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(self._pod(out)))
            i += 1
        await asyncio.gather(*tasks)

    async def _pod(self, out: Pods) -> None:
        self.count += 1
        body = orjson.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{self.count:06d}"},
                             "spec": {"containers": [{"name": "main", "image": "musa-runtime",
                                                      "resources": {"limits": {VGPU: "1"}}}]}})
        started, at = time.perf_counter(), time.time()
        # Not waiting.until_async: this is the measured client's retry policy (it counts retries, stops at once on
        # an answer it must not retry, and records a failure rather than raising), not a wait for a condition.
        deadline = started + 60
        while True:
            try:
                async with self.api.post(f"/api/v1/namespaces/{self.ns}/pods", data=body,
                                         headers={"Content-Type": "application/json"}) as r:
                    text = await r.text()
                    status = r.status
            except (aiohttp.ClientError, OSError):
                status, text = 0, "connection error"
            if status == 201:
                out.created += 1
                out.client_ms.append((time.perf_counter() - started) * 1e3)
                out.client_at.append(at)
                return
            retryable = status in (0, 429, 503) or (status in (500, 504) and "webhook" not in text)
            if not retryable or time.perf_counter() > deadline:
                out.failed.append(f"HTTP {status}: {text[:300]}")
                return
            out.retried += 1
            await asyncio.sleep(0.25)

    async def probe(self, stop: asyncio.Event, out: list[float], every: float = 0.02) -> None:
        """Reviews straight to the webhook (no API server in between): any wait behind node work shows."""
        body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "00000000-0000-4000-8000-000000000001", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "probe",
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": "probe"},
                       "spec": {"containers": [{"name": "main", "image": "x",
                                                "resources": {"limits": {VGPU: "1"},
                                                              "requests": {VGPU: "1"}}}]}}}})
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.webhook_ctx)) as s:
            while not stop.is_set():
                started = time.perf_counter()
                async with s.post(f"{self.hook.url}/mutate-pods", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                out.append((time.perf_counter() - started) * 1e3)
                await asyncio.sleep(every)

    async def churn(self, rate: float, seconds: float, size: int) -> int:
        """Kubelet heartbeats: `rate` node status updates a second, to random nodes."""
        started, sent, tasks = time.perf_counter(), 0, []
        while (due := started + sent / rate) < started + seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(fleet.heartbeat(self.api, random.randrange(size))))
            sent += 1
            if len(tasks) > 200:
                await asyncio.gather(*tasks)
                tasks = []
        await asyncio.gather(*tasks)
        return sent

    async def fill(self, node: str) -> str:
        """The exclusive fill the webhook gives a pod pinned to `node`."""
        body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "00000000-0000-4000-8000-000000000002", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "probe",
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pin", "namespace": "probe"},
                       "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                "containers": [{"name": "main", "image": "x",
                                                "resources": {"limits": {VGPU: "1"}}}]}}}})
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.webhook_ctx)) as s:
            async with s.post(f"{self.hook.url}/mutate-pods", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                answer = orjson.loads(await r.read())
        for op in orjson.loads(base64.b64decode(answer["response"].get("patch") or "W10=")):
            if op["path"].endswith("limits/mthreads.com~1sgpu-memory"):
                return str(op["value"])
        return "?"


async def measure_pods(rig: Rig, rate: float, seconds: float, churn: float | None,
                       size: int) -> dict[str, Any]:
    pid = rig.hook.proc.pid
    control_plane = list(rig.cp.pids.values())
    before, cpu0, t0 = await rig.api_metrics(), usage(pid), time.perf_counter()
    cp0 = sum(usage(p)["cpu"] for p in control_plane)
    work0 = node_work(rig.hook)
    out, stop = Pods(), asyncio.Event()
    probes: list[float] = []
    rss: list[float] = []

    async def sample() -> None:
        while not stop.is_set():
            rss.append(usage(pid)["rss"])
            await asyncio.sleep(2)

    side = [asyncio.create_task(rig.probe(stop, probes)), asyncio.create_task(sample())]
    work: list[Coroutine[Any, Any, Any]] = [rig.pods(rate, seconds, out)]
    if churn:
        work.append(rig.churn(churn, seconds, size))
    done = await asyncio.gather(*work)
    stop.set()
    await asyncio.gather(*side)
    cpu1, elapsed = usage(pid), time.perf_counter() - t0
    cp1 = sum(usage(p)["cpu"] for p in control_plane)
    (_, mutate), (_, validate) = webhook_latency(await rig.api_metrics(), before)
    return {"pods": out, "probes": probes, "mutate": mutate, "validate": validate,
            "cpu": (cpu1["cpu"] - cpu0["cpu"]) / elapsed, "rss": rss, "peak": cpu1["peak"],
            "cp_cpu": (cp1 - cp0) / elapsed, "work": node_work(rig.hook).minus(work0),
            "updates": done[1] if churn else 0, "seconds": elapsed}


async def measure_churn(rig: Rig, rate: float, seconds: float, size: int) -> dict[str, Any]:
    """The webhook's CPU with node updates alone: no pods, no reviews (`rate` 0: nothing at all)."""
    pid = rig.hook.proc.pid
    cpu0, t0, work0 = usage(pid), time.perf_counter(), node_work(rig.hook)
    sent = 0
    if rate:
        sent = await rig.churn(rate, seconds, size)
    else:
        await asyncio.sleep(seconds)
    cpu1, elapsed = usage(pid), time.perf_counter() - t0
    return {"cpu": (cpu1["cpu"] - cpu0["cpu"]) / elapsed, "updates": sent, "seconds": elapsed,
            "work": node_work(rig.hook).minus(work0), "rss": cpu1["rss"]}


async def capacity_changes(rig: Rig, size: int, rounds: int = 5) -> list[float]:
    took = []
    for k in range(rounds):
        i = next(j for j in range(k * 7 + 1, size) if fleet.model_of(j) is S5000)
        name = fleet.name_of(i)
        started = time.perf_counter()
        await fleet.set_status(rig.api, name, {"capacity": {MEMORY: "1408"}})
        while await rig.fill(name) != "176" and time.perf_counter() - started < 30:
            await asyncio.sleep(0.005)
        took.append((time.perf_counter() - started) * 1e3)
        await fleet.set_status(rig.api, name, {"capacity": {MEMORY: "1280"}})
    return took


async def restart(rig: Rig, rate: float, size: int, delete: bool = True) -> dict[str, Any]:
    """Kill kube-apiserver under load, restart it, delete two nodes; watch the view come back.

    Without `delete` (the control, for a webhook that watches no node) nothing is deleted or awaited:
    it measures what the restart alone does to the API server's latency."""
    hook, out, stop = rig.hook, Pods(), asyncio.Event()
    probes: list[float] = []
    relists0 = metric(hook, "hami_mt_webhook_node_relists_total")
    work0 = node_work(hook)
    load = asyncio.create_task(rig.pods(rate, 40, out))
    prober = asyncio.create_task(rig.probe(stop, probes))
    await asyncio.sleep(5)
    killed = time.perf_counter()
    await asyncio.to_thread(rig.cp.restart_apiserver)
    back = time.perf_counter()
    metrics_from = await rig.api_metrics()
    gone = [fleet.name_of(i) for i in (size - 1, size - 4)] if delete else []
    for name in gone:
        async with rig.api.delete(f"/api/v1/nodes/{name}") as r:
            await r.read()
    expected = size - len(gone)
    while (delete and metric(hook, "hami_mt_webhook_sliced_nodes") != expected
           and time.perf_counter() - back < 60):
        await asyncio.sleep(0.05)
    converged = time.perf_counter() - back
    await load
    stop.set()
    await prober
    (_, mutate), (_, validate) = webhook_latency(await rig.api_metrics(), metrics_from)
    return {"pods": out, "down": back - killed, "converged": converged, "probes": probes,
            "work": node_work(hook).minus(work0),
            "relists": metric(hook, "hami_mt_webhook_node_relists_total") - relists0,
            "mutate": mutate, "validate": validate, "ready": hook.ready()}


def node_work(hook: Any) -> Histogram:
    """The webhook's histogram of event-loop time spent per batch of node events."""
    return histograms(hook.metrics(), "hami_mt_webhook_node_work_seconds", []).get((), Histogram())


def metric(hook: Any, name: str) -> float:
    try:
        text = hook.metrics()
    except OSError:
        return math.nan
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return math.nan


