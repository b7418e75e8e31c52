"""Bench part `hops`: what the pod webhooks cost a pod create, read from kube-apiserver's own admission
metrics.

Three configurations share one control plane and one `hami-mt-webhook serve` process, each scoped to its own
namespace by a namespaceSelector, so they run interleaved in one run without re-registering anything:

- floor: nothing of ours registered for the namespace;
- shipped: the pod webhooks and the backstop policy exactly as manifests/ ships them (the validating webhook
  is sent only pods changed after the mutating one);
- forced: the same with the validating webhook's `changed-after-mutation` matchCondition removed, so it is
  called for every slice pod (two calls per pod, the behaviour before the admission record).

Rounds alternate the configurations; each batch creates pods at a steady rate in its namespace and the part
reads the difference of /metrics around the batch: `apiserver_admission_step_admission_duration_seconds`
(per step: the mutating and validating phases), `apiserver_admission_webhook_admission_duration_seconds`
(per webhook) and `apiserver_admission_controller_admission_duration_seconds` (per admission plugin: the
backstop policy shows as ValidatingAdmissionPolicy). The step metric has no namespace label, which is why
batches never overlap. Printed figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import math
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from devtools.bench.report import Section, samples
from devtools.waiting import until_async

STEP = "apiserver_admission_step_admission_duration_seconds"
WEBHOOK = "apiserver_admission_webhook_admission_duration_seconds"
CONTROLLER = "apiserver_admission_controller_admission_duration_seconds"
CONFIGS = ("floor", "shipped", "forced")
LABEL = "bench.hami-mt/config"
VGPU, MEMORY, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
PRODUCT = "mthreads.com/gpu.product"
#: The slice pods of the batches (all admitted): kept, filled, snapped, multi-card, a sidecar beside an app.
SHAPES: tuple[tuple[str, list[dict[str, str]], dict[str, str]], ...] = (
    ("slice", [{VGPU: "1", MEMORY: "32", CORE: "8"}], {}),
    ("exclusive", [{VGPU: "1"}], {PRODUCT: "MTT-S5000"}),
    ("snap", [{VGPU: "1", MEMORY: "20", CORE: "4"}], {}),
    ("multi-card", [{VGPU: "2"}], {PRODUCT: "MTT-S5000"}),
    ("two-containers", [{VGPU: "1", MEMORY: "16", CORE: "4"}, {"cpu": "100m"}], {}),
)


# --- Prometheus text: sums and counts of histograms -------------------------------------------------------


def totals(text: str, metric: str, key: Sequence[str]) -> dict[tuple[str, ...], list[float]]:
    """[sum, count] of `metric` for pod CREATEs, by the `key` labels (merged over `rejected` and the rest)."""
    out: dict[tuple[str, ...], list[float]] = {}
    for name, labels, value in samples(text):
        if name not in (metric + "_sum", metric + "_count"):
            continue
        if labels.get("operation") != "CREATE" or labels.get("resource", "pods") != "pods" or labels.get(
                "subresource"):
            continue
        slot = out.setdefault(tuple(labels.get(k, "") for k in key), [0.0, 0.0])
        slot[0 if name.endswith("_sum") else 1] += value
    return out


def minus(after: dict[tuple[str, ...], list[float]], before: dict[tuple[str, ...], list[float]]
          ) -> dict[tuple[str, ...], list[float]]:
    return {k: [v[0] - before.get(k, [0.0, 0.0])[0], v[1] - before.get(k, [0.0, 0.0])[1]]
            for k, v in after.items()}


@dataclass
class Tally:
    """One configuration's metrics, summed over its batches."""

    pods: int = 0
    client_ms: list[float] = field(default_factory=list)
    step: dict[tuple[str, ...], list[float]] = field(default_factory=dict)
    webhook: dict[tuple[str, ...], list[float]] = field(default_factory=dict)
    controller: dict[tuple[str, ...], list[float]] = field(default_factory=dict)
    batches: list[float] = field(default_factory=list)  # admission ms per pod (both steps), per batch

    def add(self, name: str, delta: dict[tuple[str, ...], list[float]]) -> None:
        mine = getattr(self, name)
        for k, (s, c) in delta.items():
            slot = mine.setdefault(k, [0.0, 0.0])
            slot[0] += s
            slot[1] += c

    def per_pod_ms(self, name: str, key: tuple[str, ...]) -> float:
        s, _ = getattr(self, name).get(key, [0.0, 0.0])
        return s * 1e3 / self.pods if self.pods else math.nan

    def calls_per_pod(self, name: str, key: tuple[str, ...]) -> float:
        _, c = getattr(self, name).get(key, [0.0, 0.0])
        return c / self.pods if self.pods else math.nan

    @property
    def admission_ms(self) -> float:
        """Both admission steps (mutating and validating), per pod."""
        return sum(s for s, _ in self.step.values()) * 1e3 / self.pods if self.pods else math.nan


# --- the configurations ------------------------------------------------------------------------------------


def scoped(docs: list[dict[str, Any]], config: str) -> list[dict[str, Any]]:
    """The pod webhooks and the backstop of the rendered local overlay, renamed for `config` and limited to
    namespaces labelled for it; `forced` loses the validating webhook's changed-after-mutation condition."""
    out = []
    only = {"key": LABEL, "operator": "In", "values": [config]}
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if name not in ("hami-mt-webhook", "hami-mt-backstop") or kind not in (
                "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding"):
            continue  # the workload check and the rollout-mode (warn) copies are not part of the comparison
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"{name}-{config}"
        if kind.endswith("WebhookConfiguration"):
            for hook in doc["webhooks"]:
                hook["name"] = f"{config}-{hook['name']}"  # the per-webhook metric is labelled by this name
                hook["namespaceSelector"]["matchExpressions"].append(only)
                if config == "forced":
                    hook["matchConditions"] = [c for c in hook["matchConditions"]
                                               if c["name"] != "changed-after-mutation"]
        elif kind == "ValidatingAdmissionPolicy":
            doc["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"].append(only)
        else:
            doc["spec"]["policyName"] = f"{doc['spec']['policyName']}-{config}"
        out.append(doc)
    return out


def install_scoped(cp: Any, hook: Any, configs: Sequence[str]) -> None:
    """Replace the shipped configurations the webhook's install applied with copies scoped to each of
    `configs` (`scoped`), so one control plane and one webhook process serve them side by side."""
    from devtools.clusters import manifests

    overlay = manifests.local_overlay(cp.workdir / "scoped-overlay", hook.url, hook.certs.bundle.read_bytes())
    rendered = [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(overlay)).stdout) if d]
    for kind, name in (("mutatingwebhookconfiguration", "hami-mt-webhook"),
                       ("validatingwebhookconfiguration", "hami-mt-webhook"),
                       ("validatingwebhookconfiguration", "hami-mt-webhook-workloads"),
                       ("validatingadmissionpolicybinding", "hami-mt-backstop")):
        cp.kubectl("delete", kind, name)
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([d for c in configs for d in scoped(rendered, c)]))


def scoped_namespace(cp: Any, ns: str, config: str) -> str:
    """A namespace labelled for `config`: the configurations scoped to it (and only those) see its pods."""
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("label", "namespace", ns, f"{LABEL}={config}")
    return ns


def pod_body(index: int, ns: str) -> bytes:
    kind, containers, selector = SHAPES[index % len(SHAPES)]
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{i}", "image": "registry.example.com/mthreads/musa-runtime:latest",
         "resources": {"limits": limits}} for i, limits in enumerate(containers)]}
    if selector:
        spec["nodeSelector"] = selector
    return orjson.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{kind}-{index:05d}",
                                                                         "namespace": ns}, "spec": spec})


class Driver:
    """Pods through the API server, and its /metrics around each batch; `body(index, namespace)` makes the
    pods (the SHAPES in turn by default)."""

    def __init__(self, api: aiohttp.ClientSession, body: Callable[[int, str], bytes] = pod_body) -> None:
        self.api = api
        self.body = body
        self.count = 0

    async def metrics(self) -> str:
        async with self.api.get("/metrics") as r:
            return await r.text()

    async def create(self, ns: str, dry_run: bool = False) -> tuple[int, float, dict[str, Any]]:
        self.count += 1
        started = time.perf_counter()
        async with self.api.post(f"/api/v1/namespaces/{ns}/pods" + ("?dryRun=All" if dry_run else ""),
                                 data=self.body(self.count, ns),
                                 headers={"Content-Type": "application/json"}) as r:
            body = await r.read()
        took = (time.perf_counter() - started) * 1e3
        return r.status, took, orjson.loads(body) if body else {}

    async def batch(self, ns: str, pods: int, rate: float, tally: Tally) -> None:
        before = await self.metrics()
        t0 = time.perf_counter()
        tasks = []
        for i in range(pods):  # open loop: each pod at its time, whether or not the last one finished
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self.create(ns)))
        results = await asyncio.gather(*tasks)
        bad = [(s, b.get("message")) for s, _, b in results if s != 201]
        if bad:
            raise RuntimeError(f"[hops] pods in {ns} not created: {bad[:3]}")
        after = await self.metrics()
        tally.pods += pods
        tally.client_ms += [t for _, t, _ in results]
        step = minus(totals(after, STEP, ["type"]), totals(before, STEP, ["type"]))
        tally.add("step", step)
        tally.add("webhook", minus(totals(after, WEBHOOK, ["name", "type"]),
                                   totals(before, WEBHOOK, ["name", "type"])))
        tally.add("controller", minus(totals(after, CONTROLLER, ["name", "type"]),
                                      totals(before, CONTROLLER, ["name", "type"])))
        tally.batches.append(sum(s for s, _ in step.values()) * 1e3 / pods)


async def until_active(namespaces: dict[str, str], acts: Callable[[str, str], Awaitable[bool]],
                       tag: str) -> None:
    """Registered configurations reach the admission chain a moment later: try `acts(config, namespace)`
    (a dry-run create) until it says each configuration acts as registered."""
    for config, ns in namespaces.items():  # 60 s: the 300 tries 0.2 s apart this gave each before
        await until_async(f"[{tag}] the {config} configuration active", functools.partial(acts, config, ns), 60, 0.2)


def mutated(status: int, body: dict[str, Any]) -> bool:
    """A pod create (or dry run) the pod webhook mutated: the pod comes back sent to hami-scheduler."""
    return status == 201 and body.get("spec", {}).get("schedulerName") == "hami-scheduler"


async def _configs_active(driver: Driver, hook: Any, namespaces: dict[str, str]) -> None:
    async def acts(config: str, ns: str) -> bool:
        validations = _reviews(hook.metrics(), "validate-pods")
        status, _, body = await driver.create(ns, dry_run=True)
        done = mutated(status, body)
        validated = _reviews(hook.metrics(), "validate-pods") > validations
        return (config == "floor" and not done) or (config == "shipped" and done) or (
            config == "forced" and done and validated)

    await until_active(namespaces, acts, "hops")


def _reviews(text: str, webhook: str) -> float:
    """The webhook's own count of reviews answered by one handler."""
    return sum((value for name, labels, value in samples(text)
                if name == "hami_mt_webhook_reviews_total" and labels.get("webhook") == webhook), 0.0)


def _api_ssl(cp: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.load_cert_chain(str(cp.workdir / "admin.crt"), str(cp.workdir / "admin.key"))
    return ctx


def part_hops(opts: argparse.Namespace, workdir: Path) -> Section:
    from devtools.clusters.controlplane import ControlPlane
    from devtools.clusters.helm_release import apply_nodes, example_nodes
    from devtools.clusters.local import LocalWebhook

    rounds, pods, rate = opts.hops_rounds, max(1, opts.pods // opts.hops_rounds), opts.rate
    print(f"[hops] starting etcd and kube-apiserver; {rounds} rounds of {pods} pods per configuration "
          f"at {rate:g}/s ...", flush=True)
    load_start = os.getloadavg()
    tallies = {c: Tally() for c in CONFIGS}
    with ControlPlane(workdir=workdir) as cp:
        version = orjson.loads(cp.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()  # namespace, RBAC, the shipped configurations (replaced below by scoped copies)
        install_scoped(cp, hook, ("shipped", "forced"))
        namespaces = {c: scoped_namespace(cp, f"hops-{c}", c) for c in CONFIGS}
        apply_nodes(cp, example_nodes())
        hook.start()
        try:
            async def run() -> None:
                connector = aiohttp.TCPConnector(ssl=_api_ssl(cp), limit=64)
                async with aiohttp.ClientSession(base_url=cp.server, connector=connector) as api:
                    driver = Driver(api)
                    await _configs_active(driver, hook, namespaces)
                    for ns in namespaces.values():  # warm-up: connections to the webhook, caches
                        await driver.batch(ns, 10, rate, Tally())
                    for r in range(rounds):
                        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
                        for config in order:
                            await driver.batch(namespaces[config], pods, rate, tallies[config])
                        print(f"[hops] round {r + 1}/{rounds}: " + ", ".join(
                            f"{c} {tallies[c].batches[-1]:.2f} ms" for c in CONFIGS), flush=True)

            asyncio.run(run())
        finally:
            hook.stop()
    return report(tallies, version, rounds, pods, rate, load_start, os.getloadavg())


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    """The part as `python -m devtools.bench --parts hops` runs it."""
    return part_hops(opts, workdir / "hops")


def _fmt(value: float, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f" ± {sd / math.sqrt(len(values)):.2f}"


def report(tallies: dict[str, Tally], version: str, rounds: int, pods: int, rate: float,
           load_start: tuple[float, ...], load_end: tuple[float, ...]) -> Section:
    sec = Section("Hops: one call or two, through kube-apiserver's own admission metrics")
    floor = tallies["floor"]
    rows = []
    for config in CONFIGS:
        t = tallies[config]
        over = t.admission_ms - floor.admission_ms
        per_batch = [b - f for b, f in zip(t.batches, floor.batches, strict=False)]
        rows.append((config, f"{t.pods:,}", _fmt(t.per_pod_ms("step", ("admit",))),
                     _fmt(t.per_pod_ms("step", ("validate",))), _fmt(t.admission_ms),
                     _fmt(t.admission_ms / floor.admission_ms if floor.admission_ms else math.nan, 1) + "×",
                     "–" if config == "floor" else _fmt(over) + _spread(per_batch),
                     "–" if config == "floor" else _fmt(_median(per_batch)),
                     _fmt(sorted(t.client_ms)[len(t.client_ms) // 2] if t.client_ms else math.nan, 1)))
    shipped = tallies["shipped"].admission_ms - floor.admission_ms
    forced = tallies["forced"].admission_ms - floor.admission_ms
    ratio = shipped / forced if forced > 0 else math.nan
    # Per round, each configuration against the floor batch of the same round: less exposed to the machine's
    # other work drifting over the run.
    rounds_ratio = _median([(s - f) / (v - f) for s, v, f in zip(
        tallies["shipped"].batches, tallies["forced"].batches, floor.batches, strict=False) if v > f])
    webhook_rows = []
    for config in ("shipped", "forced"):
        t = tallies[config]
        for (name, kind), (s, c) in sorted(t.webhook.items()):
            if name.startswith(config + "-"):
                webhook_rows.append((config, name, kind, _fmt(t.calls_per_pod("webhook", (name, kind))),
                                     _fmt(s * 1e3 / c if c else math.nan),
                                     _fmt(t.per_pod_ms("webhook", (name, kind)))))
    plugins = sorted({k for t in tallies.values() for k in t.controller})
    controller_rows = [(name, kind,
                        *(_fmt(tallies[c].per_pod_ms("controller", (name, kind)), 3) for c in CONFIGS))
                       for name, kind in plugins]
    backstop = (tallies["shipped"].per_pod_ms("controller", ("ValidatingAdmissionPolicy", "validate"))
                - floor.per_pod_ms("controller", ("ValidatingAdmissionPolicy", "validate")))
    sec.lines += [
        f"kube-apiserver {version} and etcd (local control plane) and one `hami-mt-webhook serve` process, "
        f"on the same machine (load average at the start {_load(load_start)}, at the end {_load(load_end)}; "
        "the machine is shared, so compare rows of this run only). Three configurations, each scoped to its "
        "own namespace: **floor** (nothing of ours), **shipped** (manifests/ as shipped: the mutating "
        "webhook, the validating webhook sent only pods changed after it, the backstop policy), **forced** "
        "(the same with the validating webhook's `changed-after-mutation` condition removed: two calls per "
        f"pod). {rounds} rounds, each a batch of {pods} pods per configuration at {rate:g} pods/s (open "
        "loop), the order alternating; figures are the difference of kube-apiserver's /metrics around each "
        "batch.",
        "",
        "Admission time per pod (`apiserver_admission_step_admission_duration_seconds`, sum over the pods' "
        "CREATEs / pods; over the floor: ± the standard error over rounds):",
        "",
        *_table(["configuration", "pods", "mutating step ms", "validating step ms", "admission ms", "× floor",
                 "over the floor ms", "median over rounds ms", "client p50 ms"], rows),
        "",
        f"Overhead of the shipped configuration over the floor: {_fmt(shipped)} ms per pod, against "
        f"{_fmt(forced)} ms with the validating call forced: **{_fmt(ratio)}×** (target ≤ 0.7×); the median "
        f"of the same ratio taken round by round: {_fmt(rounds_ratio)}×.",
        "",
        "Per webhook (`apiserver_admission_webhook_admission_duration_seconds`):",
        "",
        *_table(["configuration", "webhook", "type", "calls per pod", "ms per call", "ms per pod"],
                webhook_rows),
        "",
        "Per admission plugin, ms per pod (`apiserver_admission_controller_admission_duration_seconds`); the "
        "backstop policy is ValidatingAdmissionPolicy, which the floor runs too with nothing matching:",
        "",
        *_table(["plugin", "type", *CONFIGS], controller_rows),
        "",
        f"The backstop policy costs {_fmt(backstop, 3)} ms per pod over the floor's "
        "ValidatingAdmissionPolicy plugin.",
    ]
    sec.reading.append(
        f"Through kube-apiserver {version}, the shipped pod webhooks add {_fmt(shipped)} ms of admission "
        f"time per slice pod over a cluster with nothing registered, against {_fmt(forced)} ms when the "
        f"validating call is forced on every pod: {_fmt(ratio)}× (target ≤ 0.7×; round by round, median "
        f"{_fmt(rounds_ratio)}×); the backstop policy {_fmt(backstop, 2)} ms.")
    return sec


def _load(values: tuple[float, ...]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]
