"""Benchmark part `scale`: the whole webhook process on a cluster of real-sized nodes.

On the local etcd + kube-apiserver, with Nodes shaped like kubelet's (`fleet`, about 16 KB each as
the API returns them), it measures what an operator of a large GPU cluster meets:

1. start-up: `hami-mt-webhook serve` from exec to /readyz, and its peak RSS, at each size;
2. at the largest size, pods created through the API server at a steady rate, first idle, then
   under node churn (kubelet heartbeats through /status), with the webhook's CPU and RSS, the API
   server's webhook latency, and reviews sent straight to the webhook to see any wait behind node work;
3. how long a capacity change takes to reach the view;
4. kube-apiserver killed and restarted under the same pod rate: failed creations, how long until the
   view equals the API's node set again (two nodes deleted right after the restart), the rebuild.

It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import os
import random
import secrets
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from devtools import fleet

API_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
TICKS = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> dict[str, float]:
    """CPU seconds, current and peak RSS (MiB) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                status[key] = int(value.split()[0]) / 1024
    return {"cpu": (int(fields[11]) + int(fields[12])) / TICKS, "rss": status.get("VmRSS", math.nan),
            "peak": status.get("VmHWM", math.nan)}


@dataclass
class Pods:
    """Pods created through the API server at a steady rate; connection errors and the API server's own
    unavailability (it is being restarted) are retried, as a controller would."""

    created: int = 0
    failed: list[str] = field(default_factory=list)
    retried: int = 0
    client_ms: list[float] = field(default_factory=list)


class Rig:
    """The control plane, the webhook and the clients of one scale run."""

    def __init__(self, cp: Any, hook: Any, api: aiohttp.ClientSession) -> None:
        self.cp, self.hook, self.api = cp, hook, api
        self.ns = f"scale-{secrets.token_hex(3)}"
        self.count = 0
        self.webhook_ctx = ssl.create_default_context(cafile=str(hook.certs.bundle))

    async def api_metrics(self) -> str:
        for _ in range(50):
            try:
                async with self.api.get("/metrics") as r:
                    if r.status == 200:
                        return await r.text()
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError("the API server's /metrics did not answer")

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
                                                      "resources": {"limits": {fleet.VGPU: "1"}}}]}})
        started = time.perf_counter()
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
                                                "resources": {"limits": {fleet.VGPU: "1"},
                                                              "requests": {fleet.VGPU: "1"}}}]}}}})
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
                                                "resources": {"limits": {fleet.VGPU: "1"}}}]}}}})
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.webhook_ctx)) as s:
            async with s.post(f"{self.hook.url}/mutate-pods", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                answer = orjson.loads(await r.read())
        for op in orjson.loads(base64.b64decode(answer["response"].get("patch") or "W10=")):
            if op["path"].endswith("limits/mthreads.com~1sgpu-memory"):
                return str(op["value"])
        return "?"


def _hist(after: str, before: str) -> tuple[Any, Any]:
    from devtools.bench.main import Histogram, histograms

    a = histograms(after, API_METRIC, ["name", "type"], {"operation": "CREATE"})
    b = histograms(before, API_METRIC, ["name", "type"], {"operation": "CREATE"}) if before else {}
    ours = {k: h.minus(b.get(k, Histogram())) for k, h in a.items() if "hami-mt" in k[0]}
    mutate = next((h for k, h in ours.items() if k[1] == "admit"), Histogram())
    validate = next((h for k, h in ours.items() if k[1] == "validating"), Histogram())
    return mutate, validate


def _ms(values: list[float], q: float) -> float:
    from devtools.bench.main import percentile

    return percentile(sorted(values), q) if values else math.nan


async def _measure_pods(rig: Rig, rate: float, seconds: float, churn: float | None, size: int) -> dict[str, Any]:
    pid = rig.hook.proc.pid
    control_plane = list(rig.cp.pids.values())
    before, cpu0, t0 = await rig.api_metrics(), _proc(pid), time.perf_counter()
    cp0 = sum(_proc(p)["cpu"] for p in control_plane)
    work0 = _work(rig.hook)
    out, probes, stop, rss = Pods(), [], asyncio.Event(), []

    async def sample() -> None:
        while not stop.is_set():
            rss.append(_proc(pid)["rss"])
            await asyncio.sleep(2)

    side = [asyncio.create_task(rig.probe(stop, probes)), asyncio.create_task(sample())]
    work = [rig.pods(rate, seconds, out)]
    if churn:
        work.append(rig.churn(churn, seconds, size))
    done = await asyncio.gather(*work)
    stop.set()
    await asyncio.gather(*side)
    cpu1, elapsed = _proc(pid), time.perf_counter() - t0
    cp1 = sum(_proc(p)["cpu"] for p in control_plane)
    mutate, validate = _hist(await rig.api_metrics(), before)
    return {"pods": out, "probes": probes, "mutate": mutate, "validate": validate,
            "cpu": (cpu1["cpu"] - cpu0["cpu"]) / elapsed, "rss": rss, "peak": cpu1["peak"],
            "cp_cpu": (cp1 - cp0) / elapsed, "work": _work(rig.hook).minus(work0),
            "updates": done[1] if churn else 0, "seconds": elapsed}


async def _capacity_changes(rig: Rig, size: int, rounds: int = 5) -> list[float]:
    took = []
    for k in range(rounds):
        i = next(j for j in range(k * 7 + 1, size) if fleet.model_of(j) == "S5000")
        name = fleet.name_of(i)
        started = time.perf_counter()
        await fleet.set_status(rig.api, name, {"capacity": {fleet.MEMORY: "1408"}})
        while await rig.fill(name) != "176" and time.perf_counter() - started < 30:
            await asyncio.sleep(0.005)
        took.append((time.perf_counter() - started) * 1e3)
        await fleet.set_status(rig.api, name, {"capacity": {fleet.MEMORY: "1280"}})
    return took


async def _restart(rig: Rig, rate: float, size: int) -> dict[str, Any]:
    """Kill kube-apiserver under load, restart it, delete two nodes; watch the view come back."""
    hook, out, probes, stop = rig.hook, Pods(), [], asyncio.Event()
    relists0 = _metric(hook, "hami_mt_webhook_node_relists_total")
    work0 = _work(hook)
    load = asyncio.create_task(rig.pods(rate, 40, out))
    prober = asyncio.create_task(rig.probe(stop, probes))
    await asyncio.sleep(5)
    killed = time.perf_counter()
    await asyncio.to_thread(rig.cp.restart_apiserver)
    back = time.perf_counter()
    metrics_from = await rig.api_metrics()
    gone = [fleet.name_of(i) for i in (size - 1, size - 4)]
    for name in gone:
        async with rig.api.delete(f"/api/v1/nodes/{name}") as r:
            await r.read()
    expected = size - len(gone)
    while _metric(hook, "hami_mt_webhook_sliced_nodes") != expected and time.perf_counter() - back < 60:
        await asyncio.sleep(0.05)
    converged = time.perf_counter() - back
    await load
    stop.set()
    await prober
    mutate, validate = _hist(await rig.api_metrics(), metrics_from)
    return {"pods": out, "down": back - killed, "converged": converged, "probes": probes,
            "work": _work(hook).minus(work0),
            "relists": _metric(hook, "hami_mt_webhook_node_relists_total") - relists0,
            "mutate": mutate, "validate": validate, "ready": hook.ready()}


def _work(hook: Any) -> Any:
    """The webhook's histogram of event-loop time spent per batch of node events."""
    from devtools.bench.main import Histogram, histograms

    return histograms(hook.metrics(), "hami_mt_webhook_node_work_seconds", []).get((), Histogram())


def _slowest(h: Any) -> str:
    """The bucket that holds the slowest batch: `≤ X ms`."""
    bound = min((le for le, c in h.buckets.items() if c >= h.count), default=math.inf)
    return f"≤ {bound * 1e3:g}" if not math.isinf(bound) else "> 250"


def _tenth(samples: list[float], which: int) -> float:
    """Mean of the first (0) or last (-1) tenth of the samples: whether memory drifts over a run."""
    n = max(1, len(samples) // 10)
    part = samples[:n] if which == 0 else samples[-n:]
    return sum(part) / len(part) if part else math.nan


def _metric(hook: Any, name: str) -> float:
    try:
        text = hook.metrics()
    except OSError:
        return math.nan
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return math.nan


def part_scale(opts: argparse.Namespace, workdir: Path) -> Any:
    from devtools.bench.main import Section, _api_ssl, fmt, table
    from devtools.controlplane import ControlPlane
    from devtools.local import LocalWebhook

    sizes = sorted(opts.scale_sizes)
    sec = Section("Scale: the whole process on a cluster of real-sized nodes")
    print(f"[scale] starting etcd and kube-apiserver; fleet sizes {sizes} ...", flush=True)
    with ControlPlane(workdir=workdir) as cp:
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()
        cp.kubectl("create", "namespace", "probe")

        async def run() -> dict[str, Any]:
            res: dict[str, Any] = {"startup": []}
            async with fleet.session(cp.server, _api_ssl(cp), connections=64) as api:
                rig = Rig(cp, hook, api)
                async with api.post("/api/v1/namespaces", json={"metadata": {"name": rig.ns}}) as r:
                    await r.read()
                have = 0
                for size in sizes:
                    t = time.perf_counter()
                    await fleet.create(api, range(have, size))
                    made = time.perf_counter() - t
                    have = size
                    async with api.get(f"/api/v1/nodes/{fleet.name_of(0)}") as r:
                        node_bytes = len(await r.read())
                    print(f"[scale] {size} nodes ({made:.0f} s to create); starting the webhook", flush=True)
                    t = time.perf_counter()
                    await asyncio.to_thread(hook.start, 900.0)
                    ready = time.perf_counter() - t
                    usage = _proc(hook.proc.pid)
                    res["startup"].append((size, node_bytes, ready, usage["peak"], usage["rss"]))
                    print(f"[scale] {size}: ready in {ready:.1f} s, peak RSS {usage['peak']:.0f} MiB", flush=True)
                    if size != sizes[-1]:
                        hook.stop()
                print("[scale] idle pods ...", flush=True)
                res["idle"] = await _measure_pods(rig, opts.rate, opts.scale_seconds, None, have)
                print(f"[scale] pods under {opts.scale_churn:g} node updates/s for {opts.churn_seconds:g} s ...",
                      flush=True)
                res["churn"] = await _measure_pods(rig, opts.rate, opts.churn_seconds, opts.scale_churn, have)
                # The control: the same churn with a webhook that watches no node (a selector nothing
                # matches), so what the API server's own load costs is told apart from the view's work.
                print("[scale] the same churn, webhook watching no node (control) ...", flush=True)
                await asyncio.to_thread(hook.stop)
                hook.extra_args = ["--node-selector", "hami-mt-bench/none=true"]
                await asyncio.to_thread(hook.start, 120.0)
                res["control"] = await _measure_pods(rig, opts.rate, opts.churn_seconds, opts.scale_churn, have)
                await asyncio.to_thread(hook.stop)
                hook.extra_args = []
                await asyncio.to_thread(hook.start, 900.0)
                print("[scale] capacity changes ...", flush=True)
                res["capacity"] = await _capacity_changes(rig, have)
                print("[scale] kube-apiserver killed and restarted under load ...", flush=True)
                res["restart"] = await _restart(rig, opts.rate, have)
                res["size"] = have
            return res

        try:
            res = asyncio.run(run())
        finally:
            hook.stop()

    rows = [(f"{n:,}", f"{b / 1024:.1f} KB", fmt(t, 1), f"{p:.0f}", f"{r:.0f}") for n, b, t, p, r in res["startup"]]
    sec.lines += [
        "Nodes shaped like kubelet's (`hami_mt_webhook/fleet.py`: 13 labels, 5 conditions, 40 images, nodeInfo, "
        "a taint, managed fields; two thirds S5000, one third S4000), created through the API server; "
        "`hami-mt-webhook serve` started as its own process, logged in as the shipped ServiceAccount.",
        "",
        *table(["nodes", "a Node as the API returns it", "exec to /readyz (s)", "peak RSS (MiB)", "RSS at ready (MiB)"],
               rows),
        "",
    ]
    idle, churn, control, restart = res["idle"], res["churn"], res["control"], res["restart"]

    def lat(r: dict[str, Any]) -> list[str]:
        p = r["pods"]
        return [f"{r['mutate'].mean * 1e3:.2f}", f"{r['mutate'].quantile(0.99) * 1e3:.2f}",
                f"{r['validate'].mean * 1e3:.2f}", f"{r['validate'].quantile(0.99) * 1e3:.2f}",
                f"{_ms(r['probes'], 50):.2f}", f"{_ms(r['probes'], 99):.1f}",
                f"{max(r['probes'], default=math.nan):.1f}",
                f"{p.created}/{p.created + len(p.failed)}", f"{r['cpu'] * 100:.1f} %" if "cpu" in r else "–",
                f"{r['cp_cpu'] * 100:.0f} %" if "cp_cpu" in r else "–",
                f"{r['work'].count:,.0f}", _slowest(r["work"])]

    rows = [["idle", *lat(idle)], [f"{opts.scale_churn:g} node updates/s", *lat(churn)],
            [f"{opts.scale_churn:g} node updates/s, webhook watching no node (control)", *lat(control)],
            ["kube-apiserver restart, view rebuilt", *lat(restart)]]
    sec.lines += [
        f"At {res['size']:,} nodes, pods created at {opts.rate:g}/s through the API server (admin client) while "
        "reviews are also sent straight to the webhook every 20 ms (`direct`): the API server's figures come from "
        "its `apiserver_admission_webhook_admission_duration_seconds` (coarse buckets: p99 interpolated, mean exact).",
        "",
        *table(["phase", "mutating mean ms", "mutating p99 ms", "validating mean ms", "validating p99 ms",
                "direct p50 ms", "direct p99 ms", "direct max ms", "pods created", "webhook CPU",
                "etcd + API server CPU", "node batches", "slowest batch ms"], rows),
        "",
        f"- Churn: {churn['updates']:,} node status updates in {churn['seconds']:.0f} s cost the webhook "
        f"{churn['cpu'] * 100:.1f} % of one core, pods and reviews included (idle pods alone: "
        f"{idle['cpu'] * 100:.1f} %). RSS during churn {min(churn['rss']):.0f}–{max(churn['rss']):.0f} MiB "
        f"(sampled every 2 s; mean of the first tenth {_tenth(churn['rss'], 0):.1f}, of the last tenth "
        f"{_tenth(churn['rss'], -1):.1f}), peak since start {churn['peak']:.0f} MiB.",
        f"- A capacity change (node status patched) reached the view in "
        f"{', '.join(f'{t:.0f}' for t in res['capacity'])} ms (patch sent to a review answering with it).",
        f"- kube-apiserver SIGKILLed and restarted under {opts.rate:g} pods/s: it was back after "
        f"{restart['down']:.1f} s; {restart['pods'].created} pods created, {len(restart['pods'].failed)} failed, "
        f"{restart['pods'].retried} attempts retried while it was down; two nodes deleted as it returned; the view "
        f"equalled the API's node set {restart['converged']:.1f} s after it was back "
        f"({restart['relists']:.0f} rebuild(s)); /readyz {'stayed ready' if restart['ready'] else 'NOT ready'}.",
    ]
    if restart["pods"].failed:
        sec.lines.append("- Failures: " + "; ".join(sorted(set(restart["pods"].failed))[:3]))
    last = res["startup"][-1]
    sec.reading.append(
        f"At {last[0]:,} real-sized nodes a replica is ready {last[2]:.1f} s after exec with a peak RSS of "
        f"{last[3]:.0f} MiB (the whole process); 100 node updates/s cost {churn['cpu'] * 100:.1f} % of a core; "
        f"after a kube-apiserver restart the view is exact again in {restart['converged']:.1f} s.")
    return sec
