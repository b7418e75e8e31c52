"""Part `apiserver`: pods created through a local kube-apiserver, and its webhook-latency histograms."""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from devtools.bench.report import Histogram, Section, fmt, histograms, percentile, table
from devtools.bench.workload import EXPECT, KINDS, cluster
from devtools.gpus import pod
from devtools.load import fleet

#: kube-apiserver's histogram of the time each webhook call takes.
API_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    from devtools.clusters.controlplane import ControlPlane
    from devtools.clusters.local import LocalWebhook

    sec = Section("4. Through a real kube-apiserver")
    nodes = cluster(opts.s5000, opts.s4000)
    print("[apiserver] starting etcd and kube-apiserver ...", flush=True)
    with ControlPlane(workdir=workdir / "controlplane") as cp:
        version = cp.kubectl("version", "-o", "json", check=False).stdout
        server_version = (orjson.loads(version).get("serverVersion", {}).get("gitVersion", "?")
                          if version.strip().startswith("{") else "?")
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()
        started = time.perf_counter()
        asyncio.run(create_nodes(cp, nodes))
        print(f"[apiserver] {len(nodes)} nodes created in {time.perf_counter() - started:.1f} s", flush=True)
        hook.start()
        try:
            result = asyncio.run(_drive_pods(cp, hook, opts))
        finally:
            hook.stop()
    mutate, validate, own, client, statuses, bounds = (result.mutate, result.validate, result.own,
                                                       result.client, result.statuses, result.bounds)
    rows = []
    for label, h in (("mutating (" + mutate[0] + ")", mutate[1]),
                     ("validating (" + validate[0] + ")", validate[1])):
        if not h.count:  # the validating webhook is called only for a pod changed after the mutating one
            continue
        rows.append((f"API server: {label}", f"{h.count:,.0f}", fmt(h.quantile(0.5) * 1e3),
                     fmt(h.quantile(0.99) * 1e3), fmt(h.mean * 1e3),
                     f"{h.share_within(bounds[0]):.1%}" if bounds else "–"))
    for name, h in own.items():
        rows.append((f"webhook's own histogram: /{name}", f"{h.count:,.0f}", fmt(h.quantile(0.5) * 1e3, 3),
                     fmt(h.quantile(0.99) * 1e3, 3), fmt(h.mean * 1e3, 3), ""))
    rows.append(("client: pod create round trip", f"{len(client):,}", fmt(percentile(client, 50)),
                 fmt(percentile(client, 99)), fmt(sum(client) / len(client) if client else math.nan), ""))
    first = f"≤ {bounds[0] * 1e3:g} ms" if bounds else "first bucket"
    sec.lines += [
        f"kube-apiserver {server_version} and etcd (local control plane), `hami-mt-webhook serve` as its own "
        f"process registered through the manifests' local overlay, {len(nodes)} nodes "
        f"({opts.s5000} S5000 + {opts.s4000} S4000). {opts.pods} pods of the part-1 mix created by POST "
        f"/api/v1/namespaces/<fresh>/pods at {opts.rate:g}/s (open loop, admin client certificate); "
        "histograms are the difference of /metrics before and after (after 10 warm-up pods), merged over "
        "`rejected` and `operation`.",
        "",
        *table(["what", "reviews", "p50 ms", "p99 ms", "mean ms", f"share {first}"], rows),
        "",
        "API server bucket bounds (s): " + ", ".join(f"{b:g}" for b in bounds)
        + ". Its buckets are coarse, so "
        "p50 and p99 are linear guesses inside a bucket (`histogram_quantile`); the mean (sum/count) is "
        "exact. The webhook's own histogram (`hami_mt_webhook_review_duration_seconds`) times the body read "
        "to the response built; the difference to the API server's mean is the HTTP, TLS and JSON round "
        "trip. The validating webhook is called only for a pod that something changed after the mutating "
        f"one (the `hami-mt.mthreads.com/admitted` record): {validate[1].count:,.0f} calls here.",
        "",
        "Pod creations answered: " + ", ".join(f"HTTP {k}: {v}" for k, v in sorted(statuses.items()))
        + " (the denied kind is expected to get 403).",
    ]
    h = mutate[1]
    sec.reading.append(
        f"Through kube-apiserver at {opts.rate:g} pods/s the mutating webhook adds {h.mean * 1e3:.2f} ms on "
        f"average (p50 ≈ {h.quantile(0.5) * 1e3:.2f} ms, p99 ≈ {h.quantile(0.99) * 1e3:.2f} ms from "
        "coarse buckets), "
        + (f"the validating one {validate[1].mean * 1e3:.2f} ms" if validate[1].count else
           "the validating one is not called (no pod is changed after the mutating webhook)")
        + f"; a pod create takes {percentile(client, 50):.1f} ms (p50) end to end.")
    return sec


async def create_nodes(cp: Any, nodes: list[dict[str, Any]]) -> None:
    """Create the Nodes and set their capacity through the status subresource, as kubelet would."""
    gate = asyncio.Semaphore(16)
    async with admin_session(cp) as s:
        async def one(n: dict[str, Any]) -> None:
            meta = {"name": n["metadata"]["name"], "labels": n["metadata"]["labels"]}
            capacity = n["status"]["capacity"]
            async with gate:
                async with s.post("/api/v1/nodes",
                                  json={"apiVersion": "v1", "kind": "Node", "metadata": meta}) as r:
                    if r.status not in (201, 409):
                        raise RuntimeError(f"creating node {meta['name']}: HTTP {r.status} {await r.text()}")
                async with s.patch(f"/api/v1/nodes/{meta['name']}/status",
                                   data=orjson.dumps({"status": {"capacity": capacity,
                                                                 "allocatable": capacity}}),
                                   headers={"Content-Type": "application/merge-patch+json"}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"patching node {meta['name']}: HTTP {r.status} {await r.text()}")

        await asyncio.gather(*(one(n) for n in nodes))


def admin_session(cp: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=cp.server,
                                 connector=aiohttp.TCPConnector(ssl=fleet.admin_context(cp)))


@dataclass
class ApiResult:
    mutate: tuple[str, Histogram]  # webhook name, histogram of the run
    validate: tuple[str, Histogram]
    own: dict[str, Histogram]  # the webhook's own review-duration histogram, by handler
    client: list[float]  # sorted pod-create round trips, ms
    statuses: dict[int, int]
    bounds: list[float]  # the API server's finite bucket bounds, s


async def _drive_pods(cp: Any, hook: Any, opts: argparse.Namespace) -> ApiResult:
    ns = f"bench-{secrets.token_hex(4)}"
    client: list[float] = []
    statuses: dict[int, int] = {}
    async with admin_session(cp) as s:
        async with s.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}}) as r:
            if r.status != 201:
                raise RuntimeError(f"creating namespace {ns}: HTTP {r.status} {await r.text()}")

        async def create(i: int, record: bool) -> None:
            kind = KINDS[i % len(KINDS)]
            body = orjson.dumps(pod(kind, f"{kind}-{i:05d}", ns))
            started = time.perf_counter()
            async with s.post(f"/api/v1/namespaces/{ns}/pods", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
                took = time.perf_counter() - started
                expected = 403 if EXPECT[kind] == "denied" else 201
                if r.status != expected:
                    raise RuntimeError(f"pod {kind}-{i}: HTTP {r.status}, expected {expected}: "
                                       f"{await r.text()}")
            if record:
                client.append(took * 1e3)
                statuses[r.status] = statuses.get(r.status, 0) + 1

        async def metrics_text() -> str:
            async with s.get("/metrics") as r:
                return await r.text()

        await asyncio.gather(*(create(i, False) for i in range(10)))  # warm-up: connections to the webhook
        before, own_before = await metrics_text(), hook.metrics()
        t0 = time.perf_counter()
        tasks = []
        for i in range(opts.pods):  # open loop: each pod at its time, whether or not the last one finished
            delay = t0 + i / opts.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(create(10 + i, True)))
        await asyncio.gather(*tasks)
        print(f"[apiserver] {opts.pods} pods in {time.perf_counter() - t0:.1f} s", flush=True)
        after, own_after = await metrics_text(), hook.metrics()

    mutate, validate = webhook_latency(after, before)
    bounds = sorted(le for le in mutate[1].buckets if not math.isinf(le))
    own_metric = "hami_mt_webhook_review_duration_seconds"
    oa, ob = histograms(own_after, own_metric, ["webhook"]), histograms(own_before, own_metric, ["webhook"])
    own = {k[0]: h.minus(ob.get(k, Histogram())) for k, h in sorted(oa.items())}
    return ApiResult(mutate, validate, own, sorted(client), statuses, bounds)


def webhook_latency(after: str, before: str) -> tuple[tuple[str, Histogram], tuple[str, Histogram]]:
    """The API server's latency histograms of our mutating and validating webhook (name, histogram)
    between two /metrics texts (`before` may be empty)."""
    a = histograms(after, API_METRIC, ["name", "type"], {"operation": "CREATE"})
    b = histograms(before, API_METRIC, ["name", "type"], {"operation": "CREATE"}) if before else {}
    ours = {k: h.minus(b.get(k, Histogram())) for k, h in a.items() if "hami-mt" in k[0]}
    mutate = next(((k[0], h) for k, h in ours.items() if k[1] == "admit"), ("none", Histogram()))
    validate = next(((k[0], h) for k, h in ours.items() if k[1] == "validating"), ("none", Histogram()))
    return mutate, validate
