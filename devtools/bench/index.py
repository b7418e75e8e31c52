"""Part `index`: the node index at 100 / 1,000 / 10,000 nodes: memory, build time, per-admission lookup."""

from __future__ import annotations

import argparse
import functools
import gc
import math
import time
import tracemalloc
from pathlib import Path

import orjson

from devtools.bench.inprocess import per_call
from devtools.bench.report import Section, fmt, table
from devtools.bench.workload import cluster
from devtools.gpus import CONFIG, pod, review_body
from hami_mt_webhook.admission import review
from hami_mt_webhook.rules.capacity import ClusterView


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    sec = Section("3. Node index: memory, build time, lookup cost")
    repeat, target = (3, 0.05) if opts.quick else (5, 0.2)
    plain = pod("exclusive", selector=False)
    pinned = pod("exclusive", selector=True)
    affine = pod("exclusive", selector=False, affinity=True)
    plain_body, pinned_body = review_body(plain), review_body(pinned)
    rows = []
    lookups: dict[int, tuple[float, float]] = {}
    for n in opts.index_sizes:
        big = n * 2 // 3
        nodes = cluster(big, n - big)
        raw = orjson.dumps(nodes)
        build = math.inf
        for _ in range(3):
            started = time.perf_counter()
            view = ClusterView.from_nodes(nodes, CONFIG)
            build = min(build, time.perf_counter() - started)
        del view
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            parsed = orjson.loads(raw)  # fresh objects, so the label strings the view keeps are counted
            view = ClusterView.from_nodes(parsed, CONFIG)
            del parsed
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert len(view) == n
        t_plain = per_call(functools.partial(view.candidates, plain["spec"], CONFIG), repeat, target)
        t_sel = per_call(functools.partial(view.candidates, pinned["spec"], CONFIG), repeat, target)
        t_aff = per_call(functools.partial(view.candidates, affine["spec"], CONFIG), repeat, target)
        h_plain = per_call(functools.partial(review.handle, plain_body, "mutate-pods", view, CONFIG), repeat,
                           target)
        h_sel = per_call(functools.partial(review.handle, pinned_body, "mutate-pods", view, CONFIG), repeat,
                         target)
        lookups[n] = (t_plain, t_sel)
        rows.append((f"{n:,}", fmt(build * 1e3, 2), f"{kept / 1024:,.0f}", f"{kept / n:,.0f}",
                     fmt(t_plain * 1e6, 2), fmt(t_sel * 1e6, 1), fmt(t_aff * 1e6, 1), fmt(h_plain * 1e6, 1),
                     fmt(h_sel * 1e6, 1)))
        print(f"[index] {n:>6} nodes: build {build * 1e3:8.2f} ms  kept {kept / 1024:8,.0f} KiB  "
              f"candidates {t_plain * 1e6:6.2f} / {t_sel * 1e6:9.1f} / {t_aff * 1e6:9.1f} µs  "
              f"handle {h_plain * 1e6:7.1f} / {h_sel * 1e6:9.1f} µs", flush=True)
    sec.lines += [
        "Nodes: two thirds S5000, one third S4000, 11 labels each, as Node JSON. *build*: "
        "`ClusterView.from_nodes` from Node dicts, best of 3. *kept*: what the view keeps alive "
        "(tracemalloc, Node dicts parsed fresh inside the trace and dropped after the build, so the label "
        "strings the view holds count). Lookups: `ClusterView.candidates` for an exclusive pod with no "
        "placement constraint (answered from the per-shape summary), with `nodeSelector` "
        "`mthreads.com/gpu.product: MTT-S5000`, and with the same requirement as a required nodeAffinity "
        "term; then the whole `review.handle` for the exclusive review without and with the nodeSelector. "
        "*kept* is the view alone, inside this benchmark's process: what a running replica holds in all is "
        "the scale part's peak RSS of the whole `serve` process.",
        "",
        *table(["nodes", "build ms", "kept KiB", "bytes/node", "candidates: none µs", "nodeSelector µs",
                "nodeAffinity µs", "handle: none µs", "handle: nodeSelector µs"], rows),
    ]
    if len(lookups) >= 2:
        lo, hi = min(lookups), max(lookups)
        sec.reading.append(
            "The node view alone (in process): a pod without placement constraints is looked up in "
            f"{lookups[hi][0] * 1e6:.2f} µs at "
            f"{hi:,} nodes ({lookups[lo][0] * 1e6:.2f} µs at {lo:,}), so it does not grow with the cluster; "
            f"a nodeSelector scans the nodes: {lookups[lo][1] * 1e6:,.0f} µs at {lo:,}, "
            f"{lookups[hi][1] * 1e6:,.0f} µs at {hi:,}.")
    return sec

