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
import math
import time
from pathlib import Path
from typing import Any

from devtools.bench import scale_rig
from devtools.bench.report import Histogram, Section, fmt, percentile, table
from devtools.load import fleet


def _ms(values: list[float], q: float) -> float:
    return percentile(sorted(values), q) if values else math.nan


def _slowest(h: Any) -> str:
    """The bucket that holds the slowest batch: `≤ X ms`."""
    bound = min((le for le, c in h.buckets.items() if c >= h.count), default=math.inf)
    return f"≤ {bound * 1e3:g}" if not math.isinf(bound) else "> 250"


def _tenth(samples: list[float], which: int) -> float:
    """Mean of the first (0) or last (-1) tenth of the samples: whether memory drifts over a run."""
    n = max(1, len(samples) // 10)
    part = samples[:n] if which == 0 else samples[-n:]
    return sum(part) / len(part) if part else math.nan



def run(opts: argparse.Namespace, workdir: Path) -> Section:
    from devtools.clusters.controlplane import ControlPlane
    from devtools.clusters.local import LocalWebhook

    sizes = sorted(opts.scale_sizes)
    sec = Section("Scale: the whole process on a cluster of real-sized nodes")
    print(f"[scale] starting etcd and kube-apiserver; fleet sizes {sizes} ...", flush=True)
    with ControlPlane(workdir=workdir / "scale") as cp:
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()
        cp.kubectl("create", "namespace", "probe")

        async def run() -> dict[str, Any]:
            res: dict[str, Any] = {"startup": []}
            async with fleet.session(cp.server, fleet.admin_context(cp), connections=64) as api:
                rig = scale_rig.Rig(cp, hook, api)
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
                    assert hook.proc is not None
                    usage = scale_rig.usage(hook.proc.pid)
                    res["startup"].append((size, node_bytes, ready, usage["peak"], usage["rss"]))
                    print(f"[scale] {size}: ready in {ready:.1f} s, peak RSS {usage['peak']:.0f} MiB",
                          flush=True)
                    if size != sizes[-1]:
                        hook.stop()
                print("[scale] idle pods ...", flush=True)
                res["idle"] = await scale_rig.measure_pods(rig, opts.rate, opts.scale_seconds, None, have)
                print("[scale] quiet, then node updates alone ...", flush=True)
                res["quiet"] = await scale_rig.measure_churn(rig, 0, opts.scale_seconds, have)
                res["alone"] = await scale_rig.measure_churn(rig, opts.scale_churn, opts.scale_seconds, have)
                print(f"[scale] pods under {opts.scale_churn:g} node updates/s "
                      f"for {opts.churn_seconds:g} s ...", flush=True)
                res["churn"] = await scale_rig.measure_pods(rig, opts.rate, opts.churn_seconds,
                                                            opts.scale_churn, have)
                # The control: the same churn with a webhook that watches no node (a selector nothing
                # matches), so what the API server's own load costs is told apart from the view's work.
                print("[scale] the same churn, webhook watching no node (control) ...", flush=True)
                await asyncio.to_thread(hook.stop)
                hook.extra_args = ["--node-selector", "hami-mt-bench/none=true"]
                await asyncio.to_thread(hook.start, 120.0)
                res["control"] = await scale_rig.measure_pods(rig, opts.rate, opts.churn_seconds,
                                                              opts.scale_churn, have)
                print("[scale] kube-apiserver restarted, webhook watching no node (control) ...", flush=True)
                res["restart_control"] = await scale_rig.restart(rig, opts.rate, have, delete=False)
                await asyncio.to_thread(hook.stop)
                hook.extra_args = []
                await asyncio.to_thread(hook.start, 900.0)
                print("[scale] capacity changes ...", flush=True)
                res["capacity"] = await scale_rig.capacity_changes(rig, have)
                print("[scale] kube-apiserver killed and restarted under load ...", flush=True)
                res["restart"] = await scale_rig.restart(rig, opts.rate, have)
                res["size"] = have
            return res

        try:
            res = asyncio.run(run())
        finally:
            hook.stop()

    rows = [(f"{n:,}", f"{b / 1024:.1f} KB", fmt(t, 1), f"{p:.0f}", f"{r:.0f}")
            for n, b, t, p, r in res["startup"]]
    sec.lines += [
        "Nodes shaped like kubelet's (`devtools/load/fleet.py`: 13 labels, 5 conditions, 40 images, nodeInfo, "
        "a taint, managed fields; two thirds S5000, one third S4000), created through the API server; "
        "`hami-mt-webhook serve` started as its own process, logged in as the shipped ServiceAccount.",
        "",
        *table(["nodes", "a Node as the API returns it", "exec to /readyz (s)", "peak RSS (MiB)",
                "RSS at ready (MiB)"], rows),
        "",
    ]
    idle, churn, control, restart = res["idle"], res["churn"], res["control"], res["restart"]
    quiet, alone = res["quiet"], res["alone"]

    def lat(r: dict[str, Any]) -> list[str]:
        p = r["pods"]

        def api(h: Histogram) -> list[str]:
            # The validating webhook is called only for a pod changed after the mutating one ran.
            if not h.count:
                return ["not called", "–"]
            return [f"{h.mean * 1e3:.2f}", f"{h.quantile(0.99) * 1e3:.2f}"]

        return [*api(r["mutate"]), *api(r["validate"]),
                f"{_ms(r['probes'], 50):.2f}", f"{_ms(r['probes'], 99):.1f}",
                f"{max(r['probes'], default=math.nan):.1f}",
                f"{p.created}/{p.created + len(p.failed)}", f"{r['cpu'] * 100:.1f} %" if "cpu" in r else "–",
                f"{r['cp_cpu'] * 100:.0f} %" if "cp_cpu" in r else "–",
                f"{r['work'].count:,.0f}", _slowest(r["work"])]

    phases = [["idle", *lat(idle)], [f"{opts.scale_churn:g} node updates/s", *lat(churn)],
            [f"{opts.scale_churn:g} node updates/s, webhook watching no node (control)", *lat(control)],
            ["kube-apiserver restart, view rebuilt", *lat(restart)],
            ["kube-apiserver restart, webhook watching no node (control)", *lat(res["restart_control"])]]
    sec.lines += [
        f"At {res['size']:,} nodes, pods created at {opts.rate:g}/s through the API server (admin client) "
        "while reviews are also sent straight to the webhook every 20 ms (`direct`): the API server's "
        "figures come from its `apiserver_admission_webhook_admission_duration_seconds` (coarse buckets: p99 "
        "interpolated, mean exact). The validating webhook is called only for a pod that something changed "
        "after the mutating one (`hami-mt.mthreads.com/admitted`); nothing does here.",
        "",
        *table(["phase", "mutating mean ms", "mutating p99 ms", "validating mean ms", "validating p99 ms",
                "direct p50 ms", "direct p99 ms", "direct max ms", "pods created", "webhook CPU",
                "etcd + API server CPU", "node batches", "slowest batch ms"], phases),
        "",
        f"- Churn: {churn['updates']:,} node status updates in {churn['seconds']:.0f} s cost the webhook "
        f"{churn['cpu'] * 100:.1f} % of one core, pods and reviews included (idle pods alone: "
        f"{idle['cpu'] * 100:.1f} %). RSS during churn {min(churn['rss']):.0f}–{max(churn['rss']):.0f} MiB "
        f"(sampled every 2 s; mean of the first tenth {_tenth(churn['rss'], 0):.1f}, of the last tenth "
        f"{_tenth(churn['rss'], -1):.1f}), peak since start {churn['peak']:.0f} MiB.",
        f"- Node updates alone (no pods, no reviews): {alone['updates']:,} in {alone['seconds']:.0f} s cost "
        f"the webhook {alone['cpu'] * 100:.1f} % of one core ({alone['work'].count:,.0f} node batches, the "
        f"slowest {_slowest(alone['work'])} ms); with nothing at all to do it used "
        f"{quiet['cpu'] * 100:.1f} %.",
        f"- A capacity change (node status patched) reached the view in "
        f"{', '.join(f'{t:.0f}' for t in res['capacity'])} ms (patch sent to a review answering with it).",
        f"- kube-apiserver SIGKILLed and restarted under {opts.rate:g} pods/s: it was back after "
        f"{restart['down']:.1f} s; {restart['pods'].created} pods created, {len(restart['pods'].failed)} "
        f"failed, {restart['pods'].retried} attempts retried while it was down; two nodes deleted as it "
        f"returned; the view equalled the API's node set {restart['converged']:.1f} s after it was back "
        f"({restart['relists']:.0f} rebuild(s)); /readyz "
        f"{'stayed ready' if restart['ready'] else 'NOT ready'}.",
    ]
    if restart["pods"].failed:
        sec.lines.append("- Failures: " + "; ".join(sorted(set(restart["pods"].failed))[:3]))
    last = res["startup"][-1]
    sec.reading.append(
        f"At {last[0]:,} real-sized nodes a replica is ready {last[2]:.1f} s after exec with a peak RSS of "
        f"{last[3]:.0f} MiB (the whole process); {opts.scale_churn:g} node updates/s alone cost "
        f"{alone['cpu'] * 100:.1f} % of a core ({churn['cpu'] * 100:.1f} % with pods and reviews); "
        f"after a kube-apiserver restart the view is exact again in {restart['converged']:.1f} s.")
    return sec
