"""Part `inprocess`: microseconds per review of review.handle and rules.mutate, and of the server's
metrics and log line, with no network in between."""

from __future__ import annotations

import argparse
import cProfile
import functools
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from devtools.bench.report import Section, fmt, stats_lines, table
from devtools.bench.workload import KINDS, bodies, cluster, outcome
from devtools.gpus import CONFIG, review_body
from hami_mt_webhook.admission import review
from hami_mt_webhook.rules import pods as rules
from hami_mt_webhook.rules.capacity import ClusterView


def per_call(fn: Callable[[], Any], repeat: int, target: float) -> float:
    """Best-of-`repeat` seconds per call, each repeat running about `target` seconds."""
    number = 1
    while True:
        started = time.perf_counter()
        for _ in range(number):
            fn()
        took = time.perf_counter() - started
        if took >= target / 5 or number >= 1 << 22:
            break
        number *= 4
    number = max(1, int(number * target / max(took, 1e-9)))
    best = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / number


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    from hami_mt_webhook.service import logs
    from hami_mt_webhook.service.metrics import Metrics
    from hami_mt_webhook.service.serving.endpoint import log_decision

    sec = Section("2. In process: the rules alone")
    view = ClusterView.from_nodes(cluster(opts.s5000, opts.s4000), CONFIG)
    repeat, target = (3, 0.05) if opts.quick else (7, 0.2)
    metrics = Metrics()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    sink = open(os.devnull, "w")  # noqa: SIM115
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logs.JsonLines())
    rows = []
    totals = {"handle": 0.0, "mutate": 0.0, "validate": 0.0, "server": 0.0}
    costs: dict[str, float] = {}
    try:
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        for kind, body in zip(KINDS, bodies(), strict=True):
            obj = orjson.loads(body)["request"]["object"]
            reply = review.handle(body, "mutate-pods", view, CONFIG)
            seen = outcome(reply.decision)
            t_handle = per_call(functools.partial(review.handle, body, "mutate-pods", view, CONFIG), repeat,
                                target)
            t_mutate = per_call(functools.partial(rules.mutate, obj, view, CONFIG), repeat, target)
            if outcome(rules.mutate(obj, view, CONFIG)) != seen:
                raise RuntimeError(f"rules.mutate changed its input: the {kind} pod no longer gives {seen}")
            t_validate = math.nan
            decision = reply.decision
            if decision is not None and decision.allowed and decision.object is not None:
                admitted = review_body(decision.object)
                t_validate = per_call(
                    functools.partial(review.handle, admitted, "validate-pods", view, CONFIG), repeat, target)
            t_metrics = per_call(
                functools.partial(metrics.review, "mutate-pods", reply.request, decision, 1e-3),
                repeat, target)
            t_log = 0.0
            if decision is not None and (decision.changes or not decision.allowed):
                t_log = per_call(
                    functools.partial(log_decision, "mutate-pods", reply.request or {}, decision),
                    repeat, target)
            rows.append((kind, f"{len(body):,}", seen, fmt(t_handle * 1e6, 1), fmt(t_mutate * 1e6, 1),
                         fmt((t_handle - t_mutate) * 1e6, 1), fmt(t_validate * 1e6, 1),
                         fmt(t_metrics * 1e6, 1), fmt(t_log * 1e6, 1)))
            costs[kind] = t_handle
            totals["handle"] += t_handle
            totals["mutate"] += t_mutate
            totals["validate"] += 0 if math.isnan(t_validate) else t_validate
            totals["server"] += t_metrics + t_log
            print(f"[inprocess] {kind:10} handle {t_handle * 1e6:7.1f} µs  "
                  f"rules.mutate {t_mutate * 1e6:7.1f} µs  validate {t_validate * 1e6:7.1f} µs  "
                  f"metrics {t_metrics * 1e6:5.1f} µs  log {t_log * 1e6:5.1f} µs",
                  flush=True)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        sink.close()
    n = len(KINDS)
    mean = {k: v / n for k, v in totals.items()}
    rows.append(("**mix mean**", "", "", fmt(mean["handle"] * 1e6, 1), fmt(mean["mutate"] * 1e6, 1),
                 fmt((mean["handle"] - mean["mutate"]) * 1e6, 1), "", "", fmt(mean["server"] * 1e6, 1)))
    sec.lines += [
        f"Same view as part 1 ({opts.s5000} + {opts.s4000} nodes), in the benchmark's own process, so the "
        f"rules are {_rules_kind()}. Best of {repeat} repeats of ~{target:g} s each, "
        "gc enabled, one thread. `review.handle` is the whole seam the server calls (orjson parse, the "
        "rules, the response with its base64 JSON Patch, orjson dump); `rules.mutate` takes the already "
        "parsed pod. *validate* is `review.handle` on /validate-pods with the admitted (patched) pod, which "
        "the API server sends next. *metrics* and *log* are what `ReviewEndpoint.answer` does around "
        "`review.handle`: `Metrics.review` and, for a patch or a denial, one JSON log line at INFO (to "
        "/dev/null here).",
        "",
        *table(["review", "body bytes", "outcome", "review.handle µs", "rules.mutate µs",
                "parse + respond µs", "validate µs", "metrics µs", "log line µs"], rows),
        "",
        f"One core running only `review.handle` would answer about {1 / mean['handle']:,.0f} mutating "
        "reviews/s of this mix.",
    ]
    dearest = max(costs, key=costs.__getitem__)
    sec.reading.append(
        f"In process, a review of the mix costs {mean['handle'] * 1e6:.0f} µs in `review.handle` "
        f"(`rules.mutate` alone {mean['mutate'] * 1e6:.0f} µs; the dearest, {dearest}, "
        f"{costs[dearest] * 1e6:.0f} µs); the metrics and the INFO log line around it add "
        f"{mean['server'] * 1e6:.0f} µs.")
    if opts.profile:
        sec.lines += ["", *profile_lines(view)]
    return sec


def profile_lines(view: ClusterView, rounds: int = 3000, top: int = 25) -> list[str]:
    """cProfile of review.handle over the mix, top functions by cumulative time."""
    payloads = bodies()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(rounds):
        for body in payloads:
            review.handle(body, "mutate-pods", view, CONFIG)
    prof.disable()
    text = stats_lines(prof, "cumulative", top)
    return [f"cProfile of `review.handle` over the mix ({rounds:,} rounds of 5 reviews), top {top} by "
            "cumulative time (profiling overhead inflates small functions):", "", "```", *text, "```"]


def _rules_kind() -> str:
    """Whether this process runs the checkout's rules as Python or compiled modules (the wheel's,
    setup.py)."""
    from hami_mt_webhook.rules import pods

    if (pods.__file__ or "").endswith(".py"):
        return ("this checkout's Python sources (`make setup` installs them pure; the wheel users install "
                "compiles them with mypyc, which makes `rules.mutate` about twice as fast)")
    return "compiled with mypyc, as in the wheel"
