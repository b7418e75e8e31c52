"""Part `hami`: HAMi's own webhook beside this one, in the same harness, on the same bodies.

HAMi's webhook is built from a HAMi source tree the developer fetched (`$HAMI_MT_HAMI_SOURCE`, see
`devtools.clusters.hami`): this project's small Go main around HAMi's `routes.WebHookRoute()`, served over TLS the way
HAMi's scheduler binary serves it, with `GOMAXPROCS=1` (one core, as one Python event loop uses one).
Without the tree the part says what it needs and is skipped; nothing of HAMi lives in this repository.

- Loopback HTTPS: this webhook (from the wheel, as part `http` serves it), HAMi's and the bare aiohttp
  baseline, pinned to the same core, loaded by wrk with the five bodies of the mix, interleaved.
- Through kube-apiserver: both registered on one control plane, each scoped to its own namespace by a
  namespaceSelector (as part `hops` scopes), rounds alternating, pods of the kinds both admit; the API
  server's own histogram of each webhook's calls. What each answers per kind (HAMi answers some pods with
  an error, 500) is counted apart, one pod of each kind.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from devtools import procs
from devtools.bench import hops
from devtools.bench.apiserver import admin_session, create_nodes
from devtools.bench.http import Harness, Load, answered, post_once
from devtools.bench.report import Histogram, Section, fmt, histograms, loadavg, percentile, table
from devtools.bench.servers import Process, Server, webhook_tree
from devtools.bench.workload import KINDS, cluster
from devtools.clusters import hami
from devtools.gpus import pod
from devtools.paths import REPO_ROOT
from hami_mt_webhook.service import certs

TITLE = "Beside HAMi's webhook"
#: HAMi's webhook path (its chart's clientConfig); ours is /mutate-pods.
HAMI_PATH = "/webhook"
#: The arguments HAMi's chart gives the binary that serves its webhook (values.yaml,
#: `scheduler.extender.extraArgs`): its log verbosity as shipped.
HAMI_ARGS = ("--debug", "-v=4")
#: The kinds of the mix both webhooks admit; HAMi errs on `snap` and admits `denied`.
BOTH_ADMIT = ("slice", "exclusive", "multi-card")
#: The configurations of the kube-apiserver half, each scoped to its namespace (hops.LABEL=<name>).
WEBHOOKS = ("ours", "hami")
SHOWN = {"ours": "this webhook", "hami": "HAMi", "webhook": "this webhook", "baseline": "baseline"}
#: The name HAMi's chart gives its webhook; kube-apiserver labels the call metric with it.
HAMI_HOOK = "vgpu.hami.io"


class HamiWebhook(Process):
    """HAMi's webhook binary on a loopback port, TLS from a certificate layout, its device configuration
    (the Moore Threads section) in `workdir`, one Go scheduler thread (`GOMAXPROCS=1`)."""

    path = HAMI_PATH

    def __init__(self, binary: Path, layout: certs.Layout, workdir: Path, pin: Sequence[str],
                 name: str = "hami") -> None:
        port = procs.free_port()
        device_config = hami.write_device_config(workdir / "hami-device-config.yaml")
        cmd = [*pin, str(binary), "--device-config-file", str(device_config), "--cert_file",
               str(layout.tls_cert), "--key_file", str(layout.tls_key), "--http_bind", f"127.0.0.1:{port}",
               *HAMI_ARGS]
        super().__init__(name, cmd, port, workdir / f"{name}.log", env={**os.environ, "GOMAXPROCS": "1"})


def skipped(message: str) -> Section:
    """The part's section when there is no HAMi to build: what it needs, instead of figures."""
    print(f"[hami] skipped: {message}", flush=True)
    return Section(TITLE, [f"Skipped: {message}"], skipped=True)


def shipped_timeout(docs: Sequence[dict[str, Any]]) -> int:
    """timeoutSeconds of the shipped mutating pod webhook, which HAMi's registration gets too."""
    hook = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration"
                and d["metadata"]["name"] == "hami-mt-webhook")
    return int(hook["webhooks"][0]["timeoutSeconds"])


def hami_configuration(url: str, ca_bundle: bytes, timeout: int) -> dict[str, Any]:
    """HAMi's MutatingWebhookConfiguration as its chart writes it (name, rules, selectors, reinvocation),
    calling `url`, scoped to the namespace labelled for `hami`; with ours where the comparison needs the
    same terms: failurePolicy Fail (the chart's default is Ignore), v1 reviews first (the chart lists
    v1beta1 alone) and our timeout (the chart's is 10 s)."""
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "hami-webhook-beside"},
        "webhooks": [{
            "name": HAMI_HOOK, "admissionReviewVersions": ["v1", "v1beta1"],
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "*"}],
            "failurePolicy": "Fail", "matchPolicy": "Equivalent", "sideEffects": "None",
            "timeoutSeconds": timeout, "reinvocationPolicy": "Never",
            "namespaceSelector": {"matchExpressions": [
                ignore, {"key": hops.LABEL, "operator": "In", "values": ["hami"]}]},
            "objectSelector": {"matchExpressions": [ignore]},
        }],
    }


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    """The part as `python -m devtools.bench --parts hami` runs it."""
    try:
        src = hami.tree()
        print(f"[hami] building HAMi's webhook from {src.path} ({src.label}) ...", flush=True)
        started = time.perf_counter()
        binary = hami.build_webhook(src)
        print(f"[hami] built in {time.perf_counter() - started:.1f} s: {binary}", flush=True)
    except hami.Missing as exc:
        return skipped(str(exc))
    here = workdir / "hami"
    here.mkdir(parents=True, exist_ok=True)
    sec = Section(TITLE)
    sec.lines += [
        f"{src.label}, its webhook built from that tree with the tree's own go.mod: this project's Go main "
        "(`devtools/clusters/hami_webhook/main.go`) serving HAMi's `routes.WebHookRoute()` on POST /webhook over TLS "
        "the way HAMi's scheduler binary does, with the arguments HAMi's chart gives it "
        f"(`{' '.join(HAMI_ARGS)}`, logging to a file) and `GOMAXPROCS=1`. Its device configuration is "
        "HAMi's file with the Moore Threads section alone (`mthreads.com/vgpu`, `sgpu-memory`, `sgpu-core`).",
        "",
    ]
    _loopback(opts, workdir, here, binary, sec)
    _through_apiserver(opts, here, binary, sec)
    return sec


# --- loopback HTTPS --------------------------------------------------------------------------------------


def _loopback(opts: argparse.Namespace, workdir: Path, here: Path, binary: Path, sec: Section) -> None:
    layout = certs.ensure(here / "certs", ips=("127.0.0.1",))
    harness = Harness.detect(opts, here, layout.ca_cert)
    pin = harness.pin
    print(f"[hami] load generator: {harness.tool}; {pin.note}", flush=True)
    tree = webhook_tree(opts, workdir)  # the installed wheel, shared with the other parts of the run
    servers: list[Process] = []
    try:
        servers.append(Server("webhook", layout, here, pin.server, opts.s5000, opts.s4000, opts.log_level,
                              tree=tree))
        servers.append(HamiWebhook(binary, layout, here, pin.server))
        servers.append(Server("baseline", layout, here, pin.server, opts.s5000, opts.s4000, opts.log_level,
                              tree=REPO_ROOT))
        answers = {s.name: [post_once(s.port, body, layout.ca_cert, s.path) for body in harness.payloads]
                   for s in servers}
        results = harness.interleaved(servers, opts.connections, opts.duration, "hami")
        rss = {s.name: s.peak_rss_mib() for s in servers}
    finally:
        for s in servers:
            s.stop()
    logged = {s.name: s.log.stat().st_size / (1 + sum(r.requests for r in results if r.server == s.name))
              for s in servers if s.name != "baseline"}
    names = [s.name for s in servers]
    sec.lines += [
        "### Loopback HTTPS",
        "",
        f"The three servers pinned to the same core, one after the other; load: {harness.note}. {pin.note}. "
        f"{opts.duration:g} s per point after a 1 s warm-up per server, the servers interleaved. This webhook "
        "and the baseline as in part 1 (" + ("this checkout's sources" if opts.pure else "from the wheel")
        + f", {opts.s5000} S5000 + {opts.s4000} S4000 nodes in its view, logging at `{opts.log_level}`); "
        "HAMi's webhook reads no nodes. Same five bodies, POSTed to each server's own path.",
        "",
        "What each server answers, one review of each kind (HAMi answers `allowed: false` with code 500 "
        "inside an HTTP 200 where it cannot take a pod, so wrk counts no error for it):",
        "",
        *table(["kind", *(SHOWN.get(n, n) for n in names)],
               [(kind, *(_answer_cell(*answers[n][i]) for n in names)) for i, kind in enumerate(KINDS)]),
        "",
        *[f"- {SHOWN.get(n, n)} on {kind}: {msg}" for n in names for kind, msg in
          zip(KINDS, (_message(a) for _, a in answers[n]), strict=True) if msg],
        "",
        *table(["connections", "server", "reviews/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors"],
               [(r.connections, SHOWN.get(r.server, r.server), f"{r.rps:,.0f}", fmt(r.p50), fmt(r.p99),
                 fmt(r.p999), fmt(r.max), r.errors) for r in results]),
        "",
    ]
    by = {(r.server, r.connections): r for r in results}
    rows, said = [], []
    for c in opts.connections:
        w, h, b = by.get(("webhook", c)), by.get(("hami", c)), by.get(("baseline", c))
        if not (w and h and h.rps and h.p99):
            continue
        over_b = (f"{w.rps / b.rps:.2f}", f"{h.rps / b.rps:.2f}") if b and b.rps else ("–", "–")
        rows.append((c, f"{w.rps / h.rps:.2f}", f"{w.p99 / h.p99:.2f}", *over_b))
        said.append(_versus(c, w, h))
    sec.lines += [
        *table(["connections", "reviews/s: webhook ÷ HAMi", "p99: webhook ÷ HAMi", "webhook ÷ baseline",
                "HAMi ÷ baseline"], rows),
        "",
        "Peak RSS (VmHWM): " + ", ".join(f"{SHOWN.get(k, k)} {fmt(v, 1)} MiB" for k, v in rss.items()) + ". "
        "Log written per review: " + ", ".join(f"{SHOWN.get(k, k)} {v:,.0f} bytes" for k, v in logged.items())
        + ".",
        "",
    ]
    if said:
        sec.reading.append("Over loopback HTTPS on one pinned core (HAMi with GOMAXPROCS=1), "
                           + "; ".join(said) + ".")


def _versus(c: int, w: Load, h: Load) -> str:
    return (f"at {c} connection{'s' if c != 1 else ''} this webhook answers {w.rps:,.0f} reviews/s against "
            f"HAMi's {h.rps:,.0f} ({w.rps / h.rps:.2f}×), p99 {w.p99:.2f} ms against {h.p99:.2f} ms")


def _answer_cell(status: int, answer: dict[str, Any]) -> str:
    seen, code = answered(status, answer)
    return f"{seen} ({code})" if code and seen in ("denied", "error") else seen


def _message(answer: dict[str, Any]) -> str:
    """The message of a refusal, for the notes under the answers' table ("" for an admission)."""
    got = answer.get("response") or {}
    return "" if got.get("allowed") else str((got.get("status") or {}).get("message", ""))[:300]


# --- through kube-apiserver ------------------------------------------------------------------------------


def pod_body(index: int, ns: str) -> bytes:
    """The pods of the rounds: the kinds both webhooks admit, in turn."""
    kind = BOTH_ADMIT[index % len(BOTH_ADMIT)]
    return orjson.dumps(pod(kind, f"{kind}-{index:05d}", ns))


@dataclass
class Driven:
    """What the rounds measured: the API server's histograms of each webhook's calls (name, type), the
    tallies (admission steps, client round trips) per configuration, and the per-kind answers."""

    calls: dict[tuple[str, ...], Histogram]
    tallies: dict[str, hops.Tally]
    kinds: dict[str, list[tuple[int, str]]]  # configuration: (HTTP status, note) per kind of KINDS


def _through_apiserver(opts: argparse.Namespace, here: Path, binary: Path, sec: Section) -> None:
    from devtools.clusters import manifests
    from devtools.clusters.controlplane import ControlPlane
    from devtools.clusters.local import LocalWebhook

    nodes = cluster(opts.s5000, opts.s4000)
    rounds, pods = opts.hops_rounds, max(1, opts.pods // opts.hops_rounds)
    print(f"[hami] starting etcd and kube-apiserver; {rounds} rounds of {pods} pods per webhook at "
          f"{opts.rate:g}/s ...", flush=True)
    load_start = loadavg()
    with ControlPlane(workdir=here / "controlplane") as cp:
        version = orjson.loads(cp.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()
        hops.install_scoped(cp, hook, ("ours",))
        asyncio.run(create_nodes(cp, nodes))
        hook.start()
        theirs: HamiWebhook | None = None
        try:
            theirs = HamiWebhook(binary, hook.certs, here, (), name="hami-apiserver")  # unpinned, like ours
            config = hami_configuration(theirs.url + HAMI_PATH, hook.certs.bundle.read_bytes(),
                                        shipped_timeout(manifests.load()))
            cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))
            namespaces = {c: hops.scoped_namespace(cp, f"beside-{c}", c) for c in WEBHOOKS}
            driven = asyncio.run(_drive(cp, namespaces, rounds, pods, opts.rate))
        finally:
            if theirs is not None:
                theirs.stop()
            hook.stop()
    _apiserver_report(driven, version, len(nodes), rounds, pods, opts.rate, load_start, sec)


async def _drive(cp: Any, namespaces: dict[str, str], rounds: int, pods: int, rate: float) -> Driven:
    async with admin_session(cp) as api:
        driver = hops.Driver(api, pod_body)

        async def acts(config: str, ns: str) -> bool:
            status, _, body = await driver.create(ns, dry_run=True)
            return hops.mutated(status, body)

        await hops.until_active(namespaces, acts, "hami")
        for ns in namespaces.values():  # warm-up: connections to the webhooks, caches
            await driver.batch(ns, 10, rate, hops.Tally())
        tallies = {c: hops.Tally() for c in namespaces}
        before = await driver.metrics()
        for r in range(rounds):
            for config in (WEBHOOKS if r % 2 == 0 else tuple(reversed(WEBHOOKS))):
                await driver.batch(namespaces[config], pods, rate, tallies[config])
            print(f"[hami] round {r + 1}/{rounds}: " + ", ".join(
                f"{SHOWN[c]} {tallies[c].batches[-1]:.2f} ms admission per pod" for c in WEBHOOKS), flush=True)
        after = await driver.metrics()
        kinds = {c: [await _create_kind(api, ns, kind) for kind in KINDS] for c, ns in namespaces.items()}
    return Driven(calls(after, before), tallies, kinds)


def calls(after: str, before: str) -> dict[tuple[str, ...], Histogram]:
    """The API server's histograms of the two webhooks' calls on pod CREATEs between two /metrics texts,
    by (webhook name, type), merged over `rejected`: ours renamed `ours-...` by the scoping, HAMi's."""
    a = histograms(after, hops.WEBHOOK, ["name", "type"], {"operation": "CREATE"})
    b = histograms(before, hops.WEBHOOK, ["name", "type"], {"operation": "CREATE"})
    out = {k: h.minus(b.get(k, Histogram())) for k, h in a.items() if k[0].startswith("ours-") or k[0] == HAMI_HOOK}
    return {k: h for k, h in sorted(out.items()) if h.count > 0}


async def _create_kind(api: Any, ns: str, kind: str) -> tuple[int, str]:
    """One pod of `kind` created for real: the HTTP status, and whether it was mutated or why refused."""
    async with api.post(f"/api/v1/namespaces/{ns}/pods", data=orjson.dumps(pod(kind, f"probe-{kind}", ns)),
                        headers={"Content-Type": "application/json"}) as r:
        body = orjson.loads(await r.read() or b"{}")
    if r.status == 201:
        return r.status, "mutated" if hops.mutated(r.status, body) else "unchanged"
    return r.status, str(body.get("message", ""))[:300]


def _apiserver_report(d: Driven, version: str, nodes: int, rounds: int, pods: int, rate: float,
                      load_start: str, sec: Section) -> None:
    rows = []
    for (name, kind), h in d.calls.items():
        t = d.tallies["ours" if name.startswith("ours-") else "hami"]
        client = sorted(t.client_ms)
        rows.append((name, kind, f"{h.count:,.0f}", fmt(h.mean * 1e3), fmt(h.quantile(0.5) * 1e3),
                     fmt(h.quantile(0.99) * 1e3), fmt(t.admission_ms), fmt(percentile(client, 50)),
                     fmt(percentile(client, 99))))
    sec.lines += [
        "### Through kube-apiserver",
        "",
        f"kube-apiserver {version} and etcd (local control plane), {nodes} nodes; this webhook as `serve` "
        "runs (`LocalWebhook`, the shipped pod webhooks and backstop scoped to namespace `beside-ours`, as part "
        "`hops` scopes them) and HAMi's webhook process (not pinned either, `GOMAXPROCS=1`) registered by "
        f"HAMi's chart's MutatingWebhookConfiguration (`{HAMI_HOOK}`: CREATE pods, its `hami.io/webhook` "
        "selectors, reinvocation Never) scoped to `beside-hami`, with this webhook's failurePolicy Fail, "
        "timeout and v1 reviews. "
        f"{rounds} rounds, each a batch of {pods} pods per webhook at {rate:g} pods/s (open loop), the order "
        f"alternating; the pods are the kinds both admit ({', '.join(BOTH_ADMIT)}) in turn. Load average "
        f"{load_start} at the start, {loadavg()} at the end.",
        "",
        "Per webhook call (`apiserver_admission_webhook_admission_duration_seconds`, the difference of /metrics "
        "over the rounds; p50 and p99 interpolated inside its coarse buckets, the mean exact), the admission "
        "steps per pod (`apiserver_admission_step_admission_duration_seconds`, both steps: ours includes its "
        "matchConditions and the backstop policy) and the client's pod create round trip:",
        "",
        *table(["webhook", "type", "calls", "mean ms", "p50 ms", "p99 ms", "admission ms per pod",
                "client p50 ms", "client p99 ms"], rows),
        "",
        "Counted apart, one pod of each kind of the mix created in each namespace (HTTP status of the create):",
        "",
        *table(["kind", *(SHOWN[c] for c in WEBHOOKS)],
               [(kind, *(f"{d.kinds[c][i][0]} {d.kinds[c][i][1]}" if d.kinds[c][i][0] == 201
                         else str(d.kinds[c][i][0]) for c in WEBHOOKS)) for i, kind in enumerate(KINDS)]),
        "",
        *[f"- {SHOWN[c]} on {kind}: {note}" for c in WEBHOOKS for kind, (status, note) in
          zip(KINDS, d.kinds[c], strict=True) if status != 201],
        "",
    ]
    ours = next((h for (n, k), h in d.calls.items() if n.startswith("ours-") and k == "admit"), None)
    theirs = next((h for (n, _), h in d.calls.items() if n == HAMI_HOOK), None)
    if ours and theirs:
        sec.reading.append(
            f"Through kube-apiserver {version}, on the pods both admit, HAMi's webhook call takes "
            f"{theirs.mean * 1e3:.2f} ms on average (p99 ≈ {theirs.quantile(0.99) * 1e3:.2f} ms) against this "
            f"webhook's {ours.mean * 1e3:.2f} ms (p99 ≈ {ours.quantile(0.99) * 1e3:.2f} ms); of the five kinds, "
            "HAMi answers " + ", ".join(f"{kind} {s}" for kind, (s, _) in zip(KINDS, d.kinds["hami"], strict=True))
            + " and this webhook " + ", ".join(f"{kind} {s}" for kind, (s, _) in
                                               zip(KINDS, d.kinds["ours"], strict=True)) + ".")

