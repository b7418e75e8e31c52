"""Benchmark: the webhook beside a bare aiohttp TLS server, the rules in process, the node index,
and the webhook as kube-apiserver measures it.

    python -m devtools.bench                          # every part, 10 s per load point
    python -m devtools.bench --quick --skip-apiserver # 2 s per point, no control plane
    python -m devtools.bench --write docs/PERFORMANCE.md
    python -m devtools.bench --parts hami --write docs/PERFORMANCE.md  # the other parts' sections kept

It prints figures and asserts nothing: a benchmark, not a timed test. Only 127.0.0.1 is contacted.
Servers run pinned to one CPU and the load generator to another (`taskset`), so on a 2-core machine
they never share a core; whatever else runs on the machine still shows in the numbers, which is why
the load average is recorded beside them.

Parts (`--parts`):
  http       wrk (or the built-in Python client) against the webhook and a bare aiohttp TLS server
  inprocess  microseconds per review of review.handle and rules.mutate, and of the server's metrics and log line
  index      the node index at 100 / 1,000 / 10,000 nodes: memory, build time, per-admission lookup
  apiserver  pods created through a local kube-apiserver; its webhook-latency histograms
  hostile    hostile clients against the listeners (idle and slow-read floods, unfinished handshakes,
             large reviews, odd bodies; slow headers and idle connections on the probe port): what a fresh
             caller and the probes see while each is held
  scale      the whole process on 1,000 / 5,000 / 10,000 real-sized nodes: start-up, memory, churn, restarts
  hops       floor, shipped and forced-validating configurations interleaved through kube-apiserver
  soak       the webhook's memory over minutes of steady reviews (10 by default)
  audit      the background audit at 10,000 nodes and 50,000 pods: a full pass, its requests, the replica's
             memory, admission while passes run (beside the same replica without the audit)
  hami       HAMi's own webhook beside this one, over loopback and through kube-apiserver (needs a HAMi
             source tree in $HAMI_MT_HAMI_SOURCE, and Go; skipped without)
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from devtools.bench import report

#: The parts, in the order they run and are numbered (`--parts 1,3`): each a module whose
#: `run(opts, workdir) -> report.Section` measures it. A new part is a module and a line here.
PARTS = {
    "http": "devtools.bench.http",
    "inprocess": "devtools.bench.inprocess",
    "index": "devtools.bench.index",
    "apiserver": "devtools.bench.apiserver",
    "hostile": "devtools.bench.hostile",
    "scale": "devtools.bench.scale",
    "hops": "devtools.bench.hops",
    "soak": "devtools.bench.soak",
    "audit": "devtools.bench.audit",
    "hami": "devtools.bench.beside_hami",
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

    p = argparse.ArgumentParser(prog="python -m devtools.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated subset of {', '.join(PARTS)} (or their numbers) [all]")
    p.add_argument("--skip-apiserver", action="store_true", help="leave out part 4 (no control plane needed)")
    p.add_argument("--quick", action="store_true",
                   help="2 s per load point, fewer repeats, 60 pods: a smoke run")
    p.add_argument("--duration", type=float, default=None, help="seconds per load point [10; --quick: 2]")
    p.add_argument("--connections", type=ints, default=[1, 16, 64], help="load points [1,16,64]")
    p.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto",
                   help="auto: wrk when installed, else the built-in asyncio client [auto]")
    p.add_argument("--s5000", type=int, default=200,
                   help="S5000 nodes (8 cards of 160) in parts 1, 2, 4 [200]")
    p.add_argument("--s4000", type=int, default=100, help="S4000 nodes (1 card of 96) in parts 1, 2, 4 [100]")
    p.add_argument("--log-level", default="info",
                   help="the webhook server's log level in part 1 [info, as shipped]")
    p.add_argument("--index-sizes", type=ints, default=[100, 1000, 10000],
                   help="part 3 node counts [100,1000,10000]")
    p.add_argument("--pods", type=int, default=None, help="pods created in part 4 [200; --quick: 60]")
    p.add_argument("--rate", type=float, default=20.0, help="pods per second in part 4 [20]")
    p.add_argument("--scale-sizes", type=ints, default=[1000, 5000, 10000],
                   help="part scale: node counts, each started from scratch [1000,5000,10000]")
    p.add_argument("--scale-seconds", type=float, default=20.0, help="part scale: seconds of idle pods [20]")
    p.add_argument("--scale-churn", type=float, default=100.0, help="part scale: node status updates/s [100]")
    p.add_argument("--churn-seconds", type=float, default=60.0,
                   help="part scale: seconds of churn (600 for the 10-minute memory figure) [60]")
    p.add_argument("--audit-nodes", type=int, default=10000, help="part audit: nodes [10000]")
    p.add_argument("--audit-pods", type=int, default=50000, help="part audit: pods [50000]")
    p.add_argument("--hostile-reviews", type=int, default=20, help="fresh reviews per attack in part 5 [20]")
    p.add_argument("--hops-rounds", type=int, default=4, help="part hops: rounds, --pods split over them [4]")
    p.add_argument("--soak-minutes", type=int, default=10, help="part soak: minutes of load [10]")
    p.add_argument("--soak-connections", type=int, default=16, help="part soak: wrk connections [16]")
    # Alike in shape only with run.py's and the CLI's flags (argparse's form): other options, nothing to share.
    p.add_argument("--before", metavar="REV",
                   help="parts http and hostile: also serve the webhook of this git revision (a worktree), "
                        "before beside after")
    p.add_argument("--pure", action="store_true",
                   help="serve the webhook from this checkout's sources, not from the built wheel (whose "
                        "rules are compiled); every part")
    p.add_argument("--profile", action="store_true",
                   help="add cProfiles: of review.handle over the mix (part 2) and of the server under load "
                        "(part 1)")
    p.add_argument("--write", type=Path, metavar="FILE",
                   help="also write the report as Markdown (docs/PERFORMANCE.md)")
    opts = p.parse_args(argv)
    names = {str(i + 1): name for i, name in enumerate(PARTS)}
    chosen = [names.get(x.strip(), x.strip()) for x in opts.parts.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in PARTS]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if opts.skip_apiserver:
        chosen = [x for x in chosen if x != "apiserver"]
    opts.parts = [x for x in PARTS if x in chosen]
    if opts.duration is None:
        opts.duration = 2.0 if opts.quick else 10.0
    if opts.pods is None:
        opts.pods = 60 if opts.quick else 200
    if opts.rate <= 0 or opts.pods < 1 or opts.duration <= 0 or not opts.connections:
        p.error("--rate, --pods, --duration and --connections must be positive")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("_serve", "_load"):
        from devtools.bench.servers import internal

        return internal(argv)
    opts = parse_args(argv)
    if not opts.pure:  # `serve` as users run it: the wheel's command, its rules compiled (setup.py)
        from devtools.builds import wheel
        from devtools.clusters.local import LocalWebhook

        LocalWebhook.command_prefix = (str(wheel.install_cached().exe),)
    started, load_start = dt.datetime.now(dt.UTC), report.loadavg()
    print(f"hami-mt-webhook benchmark: parts {', '.join(opts.parts)}; load average {load_start}", flush=True)
    sections: list[report.Section] = []
    with tempfile.TemporaryDirectory(prefix="hami-mt-bench-") as tmp:
        for part in opts.parts:
            sec = importlib.import_module(PARTS[part]).run(opts, Path(tmp))
            sec.part = part
            sections.append(sec)
            print("\n" + sec.markdown(), flush=True)
    if opts.write:  # the sections of parts not run now are kept from the report written before
        old = opts.write.read_text() if opts.write.exists() else ""
        merged, shared = report.merge(old, sections, list(PARTS))
        report.write(opts.write, report.document(argv, merged, opts, started, load_start, report.loadavg(),
                                                 shared))
        print(f"written to {opts.write}")
    else:
        print("## Reading\n\n" + "\n".join(f"- {line}" for s in sections for line in s.reading))
    return 0
