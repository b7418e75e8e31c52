"""Benchmark part `audit`: the background audit on a cluster of real-sized nodes and pods.

On the local etcd + kube-apiserver, with Kyverno's PolicyReport CRDs installed, 10,000 Nodes shaped like
kubelet's (`fleet`) and 50,000 slice pods shaped like a training job's (labels, an owner, two containers with
environment, ports, probes and mounts; nine in ten in the webhook's admitted form, one in ten as a pod admission
never saw, on default-scheduler) in 50 namespaces, the webhook's whole process is run three times from exec,
without the audit, with passes back to back and at the chart's interval, and measured in the same run:

1. the full pass: its time (the webhook's own `hami_mt_webhook_audit_duration_seconds`), the first (which
   writes a PolicyReport per namespace) and the next (which writes nothing), and the API server requests it
   makes (`hami_mt_webhook_audit_api_requests_total`: paged lists, no watch);
2. the replica's memory: RSS at ready, and the most it reached while passes ran, without and with the audit;
3. admission while passes run back to back, and over a whole interval as the chart runs them: pods created
   at 20/s through the API server and reviews sent straight to the webhook, beside the same without the audit.

It prints figures and asserts nothing. The pods are created where the webhooks skip (a namespace labelled
`hami.io/webhook: ignore`, the label then removed): fast, and the audit still meets every one.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from devtools.bench import scale_rig
from devtools.bench.report import Section, fmt, percentile, samples, table
from devtools.clusters import policyreports
from devtools.clusters.helm_release import NAMESPACE
from devtools.gpus import MEMORY, S4000, S5000, VGPU
from devtools.load import fleet
from devtools.paths import CHART
from hami_mt_webhook.admission.enforcement import admit_pod
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config

CORE = "mthreads.com/sgpu-core"
NAMESPACES = 50
#: One pod in this many is one admission never saw: on default-scheduler, a failure in its report.
UNSEEN_EVERY = 10
#: Seconds between passes: shorter than a pass at this size, so passes run back to back while measured.
INTERVAL = 10
#: kube-apiserver's webhook latency histogram has buckets at 5, 25 and 100 ms: a p99 between two of them is
#: interpolated, so how many calls took longer than this one is the figure that says what moved.
SLOW = 0.025


def without_consistency_checks(bin_dir: Path) -> list[str]:
    """kube-apiserver's flags that turn off its own check of each watch cache against etcd (on by default since
    1.34: every 5 to 7.5 minutes it lists the whole resource from etcd, and at 50,000 pods that held the rig's
    control-plane core at ~90 % for ~8 s, putting most creations of those seconds over SLOW with or without the
    audit). The runs are compared with the audit as the one difference: a check falling in one of them would
    decide the comparison by chance."""
    out = subprocess.run([str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True,
                         check=True).stdout
    minor = int(out.split("v1.", 1)[1].split(".", 1)[0])
    return ["--feature-gates=DetectCacheInconsistency=false"] if minor >= 34 else []


def chart_interval() -> int:
    """The chart's default seconds between passes: admission is measured over a whole one of them too."""
    return int(yaml.safe_load((CHART / "values.yaml").read_text())["audit"]["interval"])


def pod_body(i: int, admitted: dict[str, Any] | None) -> dict[str, Any]:
    """The `i`th pod, about 3 KB: in its admitted form (`admitted`, the mutating webhook's output of the same
    manifest) or as written."""
    if admitted is not None:
        body = copy.deepcopy(admitted)
    else:
        body = template()
    body["metadata"]["name"] = f"train-{i:06d}"
    body["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(i % 64)
    return body


def template() -> dict[str, Any]:
    """A training job's worker, as its manifest writes it."""
    env = [{"name": f"MCCL_SETTING_{k}", "value": f"value-{k}-" + "x" * 24} for k in range(8)]
    main = {"name": "worker", "image": "registry.example.com/mthreads/megatron-musa:2.4.0-py310",
            "command": ["torchrun", "--nnodes", "8", "--nproc-per-node", "1", "pretrain_gpt.py"],
            "env": env, "ports": [{"containerPort": 29500, "name": "rendezvous"}],
            "resources": {"limits": {VGPU: "1", MEMORY: "32", CORE: "8", "cpu": "8", "memory": "64Gi"},
                          "requests": {"cpu": "4", "memory": "32Gi"}},
            "readinessProbe": {"tcpSocket": {"port": 29500}, "periodSeconds": 10},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "shm", "mountPath": "/dev/shm"}]}
    sidecar = {"name": "metrics", "image": "registry.example.com/mthreads/exporter:1.3",
               "ports": [{"containerPort": 9400, "name": "metrics"}],
               "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"labels": {"app": "pretrain", "team": "llm", "job-name": "pretrain-7b",
                                    "controller-uid": "6f1c2d3e-0000-4000-8000-000000000001"},
                         "annotations": {"kubectl.kubernetes.io/default-container": "worker",
                                         "prometheus.io/port": "9400"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain-7b",
                                              "uid": "6f1c2d3e-0000-4000-8000-000000000001",
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"containers": [main, sidecar], "restartPolicy": "Never",
                     "tolerations": [{"key": "mthreads.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                                 {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]}}


def admitted_form() -> dict[str, Any]:
    """What the mutating webhook makes of `template()` (hami-scheduler, requests equal to limits, the record)."""
    view = ClusterView([S5000.report("s5000"), S4000.report("s4000")])
    decision = admit_pod(template(), view, Config())
    assert decision.allowed, decision.message
    return dict(decision.object)


async def create_pods(api: Any, total: int) -> float:
    """`total` pods over NAMESPACES namespaces the webhooks skip, then the label removed; the seconds taken."""
    started = time.perf_counter()
    names = [f"audit-{n:02d}" for n in range(NAMESPACES)]
    for ns in names:
        body = {"metadata": {"name": ns, "labels": {"hami.io/webhook": "ignore"}}}
        async with api.post("/api/v1/namespaces", json=body) as r:
            await r.read()
    admitted = admitted_form()
    gate = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        body = orjson.dumps(pod_body(i, None if i % UNSEEN_EVERY == 0 else admitted))
        async with gate:
            async with api.post(f"/api/v1/namespaces/{names[i % NAMESPACES]}/pods", data=body,
                                headers={"Content-Type": "application/json"}) as r:
                if r.status != 201:
                    raise RuntimeError(f"creating pod {i}: HTTP {r.status} {(await r.text())[:300]}")

    for start in range(0, total, 2000):
        await asyncio.gather(*(one(i) for i in range(start, min(total, start + 2000))))
    for ns in names:
        async with api.patch(f"/api/v1/namespaces/{ns}", data=orjson.dumps(
                {"metadata": {"labels": {"hami.io/webhook": None}}}),
                headers={"Content-Type": "application/merge-patch+json"}) as r:
            await r.read()
    return time.perf_counter() - started


def slow_around_pass(pods: scale_rig.Pods, last: dict[str, Any], step: float = 5.0) -> str:
    """Creations slower than SLOW (as the client saw them) before the last pass, in each `step` seconds of it,
    and after it: where in a pass kube-apiserver's own calls slow down."""
    end = last.get("last_success_timestamp_seconds", math.nan)
    start = end - last.get("duration_seconds", math.nan)
    if math.isnan(start):
        return "no pass ended while measured"
    bins: dict[str, list[int]] = {}
    for at, took in zip(pods.client_at, pods.client_ms, strict=True):
        key = ("before" if at < start else "after" if at >= end
               else f"{int((at - start) // step) * step:.0f}-{int((at - start) // step + 1) * step:.0f} s")
        slow, total = bins.setdefault(key, [0, 0])
        bins[key] = [slow + (took > SLOW * 1e3), total + 1]
    order = ["before", *sorted((k for k in bins if k.endswith(" s")), key=lambda k: float(k.split("-")[0])),
             "after"]
    return "; ".join(f"{k} {bins[k][0]} of {bins[k][1]}" for k in order if k in bins)


def pin(pids: list[int], cpu: int) -> None:
    """Every thread of each process onto `cpu` (`taskset -a`)."""
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, capture_output=True)


def audit_metrics(hook: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": {}}
    for name, labels, value in samples(hook.metrics()):
        if name == "hami_mt_webhook_audit_api_requests_total":
            out["requests"][(labels["verb"], labels["resource"])] = value
        elif name in ("hami_mt_webhook_audit_duration_seconds",
                      "hami_mt_webhook_audit_last_success_timestamp_seconds"):
            out[name.removeprefix("hami_mt_webhook_audit_")] = value
        elif name == "hami_mt_webhook_audit_violations":
            out["violations"] = out.get("violations", 0.0) + value
    return out


async def passes(hook: Any, count: int, timeout: float = 900.0) -> list[dict[str, Any]]:
    """The webhook's audit figures after each of its next `count` passes, with the RSS sampled meanwhile."""
    out: list[dict[str, Any]] = []
    rss: list[float] = []
    last = audit_metrics(hook).get("last_success_timestamp_seconds", 0.0)
    # Not waiting.until_async: a sampling loop (the RSS every 0.2 s) that returns the passes seen by the deadline.
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        rss.append(scale_rig.usage(hook.proc.pid)["rss"])
        now = audit_metrics(hook)
        if now.get("last_success_timestamp_seconds", 0.0) > last:
            last = now["last_success_timestamp_seconds"]
            out.append({**now, "rss_max": max(rss)})
        await asyncio.sleep(0.2)
    return out


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    from devtools.builds.binaries import binaries
    from devtools.clusters.controlplane import ControlPlane
    from devtools.clusters.local import LocalWebhook

    nodes, pods = opts.audit_nodes, opts.audit_pods
    sec = Section("Audit: a full pass at 10,000 nodes and 50,000 pods")
    print(f"[audit] starting etcd and kube-apiserver; {nodes} nodes, {pods} pods ...", flush=True)
    bin_dir = binaries()
    checks_off = without_consistency_checks(bin_dir)
    with ControlPlane(bin_dir=bin_dir, workdir=workdir / "audit", apiserver_args=checks_off) as cp:
        for crd in policyreports.crds():
            cp.kubectl("apply", "--server-side", "-f", str(crd))
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()
        cp.kubectl("create", "namespace", "probe")

        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2 and shutil.which("taskset"):
            pin([*cp.pids.values(), os.getpid()], cpus[1])  # etcd, kube-apiserver and the clients on the other
        else:
            cpus = []

        async def run() -> dict[str, Any]:
            res: dict[str, Any] = {}
            async with fleet.session(cp.server, fleet.admin_context(cp), connections=64) as api:
                rig = scale_rig.Rig(cp, hook, api)
                async with api.post("/api/v1/namespaces", json={"metadata": {"name": rig.ns}}) as r:
                    await r.read()
                t = time.perf_counter()
                await fleet.create(api, range(nodes))
                res["nodes_s"] = time.perf_counter() - t
                res["pods_s"] = await create_pods(api, pods)
                print(f"[audit] {nodes} nodes in {res['nodes_s']:.0f} s, {pods} pods in {res['pods_s']:.0f} s",
                      flush=True)
                for mode, interval in (("off", 0), ("on", INTERVAL), ("chart", chart_interval())):
                    hook.extra_args = [] if mode == "off" else [
                        "--audit-interval", str(interval), "--pod-name", "bench-0", "--pod-namespace", NAMESPACE]
                    await asyncio.to_thread(hook.start, 900.0)
                    assert hook.proc is not None
                    if len(cpus) >= 2:  # the webhook on a core of its own, as beside a control plane elsewhere
                        pin([hook.proc.pid], cpus[0])
                    ready = scale_rig.usage(hook.proc.pid)
                    print(f"[audit] audit {mode}: ready, RSS {ready['rss']:.0f} MiB", flush=True)
                    figures: dict[str, Any] = {"ready_rss": ready["rss"]}
                    seconds = opts.scale_seconds
                    if mode == "off":  # as long as an interval: the calls over 25 ms compared on a like count
                        seconds = chart_interval()
                    elif mode == "on":
                        print("[audit] waiting for two passes ...", flush=True)
                        figures["passes"] = await passes(hook, 2)
                    elif mode == "chart":  # from the first pass's end, over the whole of the next and its wait
                        print("[audit] waiting for a pass ...", flush=True)
                        figures["passes"] = await passes(hook, 1)
                        seconds = interval + figures["passes"][0].get("duration_seconds", 0.0)
                    figures["seconds"] = seconds
                    print(f"[audit] audit {mode}: pods at {opts.rate:g}/s for {seconds:.0f} s ...", flush=True)
                    figures["pods"] = await scale_rig.measure_pods(rig, opts.rate, seconds, None, nodes)
                    figures["peak"] = scale_rig.usage(hook.proc.pid)["peak"]
                    figures["after"] = audit_metrics(hook)
                    res[mode] = figures
                    await asyncio.to_thread(hook.stop)
            return res

        try:
            res = asyncio.run(run())
        finally:
            hook.stop()

    off, on, chart = res["off"], res["on"], res["chart"]
    first, second = (on["passes"] + [{}, {}])[:2]
    # one whole pass's requests: the counters at the second pass's end less those at the first's
    requests = {k: n - first.get("requests", {}).get(k, 0.0) for k, n in second.get("requests", {}).items()
                if n - first.get("requests", {}).get(k, 0.0)}
    by_resource: dict[str, dict[str, float]] = {}
    for (verb, resource), n in requests.items():
        by_resource.setdefault(resource, {})[verb] = n
    sec.lines += [
        f"{nodes:,} Nodes shaped like kubelet's (`devtools/load/fleet.py`) and {pods:,} slice pods of about 3 KB "
        f"(one in {UNSEEN_EVERY} never seen by admission) in {NAMESPACES} namespaces, made in {res['nodes_s']:.0f} s "
        f"and {res['pods_s']:.0f} s; Kyverno {policyreports.KYVERNO}'s PolicyReport CRDs installed. `serve` started "
        f"from exec three times in this run, without the audit, with it every {INTERVAL} s (passes back to back) and "
        f"every {chart_interval()} s (the chart's default), "
        + ("pinned to one CPU and etcd, kube-apiserver and the clients to the other (`taskset -a`), as a replica "
           "runs beside a control plane on other nodes." if cpus else "not pinned (fewer than 2 CPUs, or no "
           "`taskset`).")
        + (" kube-apiserver's own watch-cache consistency check is off (`DetectCacheInconsistency=false`): every "
           "5 to 7.5 minutes it lists each resource whole from etcd, which at this size takes most creations of "
           "the next ~8 s over 25 ms whether the audit runs or not, and would land in one run and not another."
           if checks_off else ""),
        "",
        *table(["pass", "seconds", "violations found", "RSS at its end (MiB)"],
               [[n, fmt(p.get("duration_seconds", math.nan), 1), f"{p.get('violations', math.nan):,.0f}",
                 f"{p.get('rss_max', math.nan):.0f}"] for n, p in (("first (writes 50 reports)", first),
                                                                  ("second (writes nothing)", second))]),
        "",
        "API server requests of one whole pass (the second; the Lease's renewals included), by resource: "
        + "; ".join(f"{r} " + ", ".join(f"{int(n)} {v}" for v, n in sorted(vs.items()))
                    for r, vs in sorted(by_resource.items())) + ".",
        "",
    ]

    def ms(values: list[float], q: float) -> float:
        return percentile(sorted(values), q) if values else math.nan

    def slow_calls(r: dict[str, Any]) -> str:
        m = r["pods"]["mutate"]
        return f"{round((1 - m.share_within(SLOW)) * m.count)} of {m.count:.0f}"

    def lat(name: str, r: dict[str, Any]) -> list[str]:
        p, m = r["pods"], r["pods"]["mutate"]
        return [name, f"{m.mean * 1e3:.2f}", f"{m.quantile(0.99) * 1e3:.2f}", slow_calls(r),
                f"{ms(p['pods'].client_ms, 50):.1f}", f"{ms(p['pods'].client_ms, 99):.1f}",
                f"{ms(p['probes'], 50):.2f}", f"{ms(p['probes'], 99):.1f}",
                f"{p['pods'].created}/{p['pods'].created + len(p['pods'].failed)}",
                f"{r['ready_rss']:.0f}", f"{max(p['rss'], default=math.nan):.0f}", f"{r['peak']:.0f}",
                f"{p['cpu'] * 100:.0f} %", f"{p['cp_cpu'] * 100:.0f} %"]

    sec.lines += [
        *table(["audit", "mutating mean ms", "mutating p99 ms (histogram)", f"mutating over {SLOW * 1e3:.0f} ms",
                "creation p50 ms (client)", "creation p99 ms (client)", "direct p50 ms", "direct p99 ms",
                "pods created",
                "RSS at ready (MiB)", "RSS max while measured (MiB)", "peak RSS (MiB)", "webhook CPU",
                "etcd + API server CPU"],
               [lat(f"off ({off['seconds']:.0f} s)", off),
                lat(f"on, passes back to back ({on['seconds']:.0f} s)", on),
                lat(f"on, every {chart_interval()} s as the chart runs it (over {chart['seconds']:.0f} s: a "
                    "whole pass and wait)", chart)]),
        "",
        "kube-apiserver's histogram of webhook calls has buckets at 5, 25 and 100 ms, so its p99 is interpolated "
        f"within a bucket: the calls over {SLOW * 1e3:.0f} ms, and the creations as the client timed them (the "
        "whole request, the webhook's call inside it), are the figures that say whether admission moved.",
        "",
    ]
    sec.lines += [
        f"- Creations over {SLOW * 1e3:.0f} ms as the client saw them, around the pass inside the "
        f"{chart_interval()} s run (its start, then each 5 s of it): "
        f"{slow_around_pass(chart['pods']['pods'], chart['after'])}.",
    ]
    during = max(first.get("rss_max", math.nan), second.get("rss_max", math.nan),
                 max(on["pods"]["rss"], default=math.nan))
    sec.lines += [
        f"- Memory: with the audit the replica was at {on['ready_rss']:.0f} MiB when ready and reached {during:.0f} "
        f"MiB while passes ran ({during - on['ready_rss']:+.0f} MiB); its peak since exec {on['peak']:.0f} MiB, "
        f"against {off['peak']:.0f} MiB without the audit (the node view's build sets both).",
    ]
    sec.reading.append(
        f"At {nodes:,} nodes and {pods:,} pods a full audit pass takes {first.get('duration_seconds', math.nan):.1f} s "
        f"(target ≤ 60) and takes the replica {during - on['ready_rss']:+.0f} MiB above its RSS at ready (target ≤ "
        f"30); a pod's creation p99 as the client timed it {ms(off['pods']['pods'].client_ms, 99):.1f} ms "
        f"without the audit, {ms(on['pods']['pods'].client_ms, 99):.1f} ms with passes back to back and "
        f"{ms(chart['pods']['pods'].client_ms, 99):.1f} ms over a whole interval at the chart's "
        f"{chart_interval()} s (webhook calls over {SLOW * 1e3:.0f} ms: {slow_calls(off)}, {slow_calls(on)} and "
        f"{slow_calls(chart)}); straight to the webhook {ms(off['pods']['probes'], 99):.1f}, "
        f"{ms(on['pods']['probes'], 99):.1f} and {ms(chart['pods']['probes'], 99):.1f} ms.")
    return sec
