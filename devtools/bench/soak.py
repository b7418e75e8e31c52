"""Part `soak`: the webhook's memory over minutes of steady reviews.

`serve` must stay flat for months; uvloop's TLS transport once grew without end under steady reviews
(docs/PERFORMANCE.md, "The event loop"), so any new transport is held to the same test: the same server as
part `http` (the installed wheel unless `--pure`), wrk sending the mix for `--soak-minutes`, one minute at a
time, the process's RSS read between minutes.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from devtools import procs
from devtools.bench.http import run_wrk, wrk_script
from devtools.bench.report import Section, fmt, table
from devtools.bench.servers import Pinning, Server, webhook_tree
from devtools.bench.workload import bodies
from hami_mt_webhook.service import certs


def rss_mib(pid: int) -> float | None:
    return procs.memory_mib(pid).get("VmRSS")


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    sec = Section("Soak: the webhook's memory under steady reviews")
    if not shutil.which("wrk"):
        raise SystemExit("part soak needs wrk (Debian: apt-get install wrk, or `make wrk`)")
    layout = certs.ensure(workdir / "certs", ips=("127.0.0.1",))
    pin = Pinning.detect()
    script = workdir / "soak.lua"
    script.write_text(wrk_script(bodies()))
    srv = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, opts.log_level,
                 tree=webhook_tree(opts, workdir))
    rows = []
    try:
        idle = rss_mib(srv.proc.pid)
        print(f"[soak] idle RSS {fmt(idle, 1)} MiB; {opts.soak_minutes} minutes at {opts.soak_connections} "
              "connections", flush=True)
        for minute in range(1, opts.soak_minutes + 1):
            load = run_wrk(srv.url, script, opts.soak_connections, 60.0, pin.load, "webhook")
            now = rss_mib(srv.proc.pid)
            rows.append((minute, f"{load.requests:,}", f"{load.rps:,.0f}", fmt(load.p99), load.errors,
                         fmt(now, 1)))
            print(f"[soak] minute {minute}: {load.rps:,.0f} reviews/s, p99 {load.p99:.2f} ms, "
                  f"RSS {fmt(now, 1)} MiB", flush=True)
        peak = srv.peak_rss_mib()
    finally:
        srv.stop()
    total = sum(int(r[1].replace(",", "")) for r in rows)
    sec.lines += [
        f"The webhook as part `http` serves it (logging at `{opts.log_level}`), {opts.s5000 + opts.s4000} "
        f"nodes in its view; wrk with {opts.soak_connections} connections sending the mix in a closed loop, "
        f"one minute at a time, {opts.soak_minutes} minutes; RSS (VmRSS) read after each minute. {pin.note}.",
        "",
        *table(["minute", "reviews", "reviews/s", "p99 ms", "errors", "RSS MiB"], rows),
        "",
        f"Idle before the load: {fmt(idle, 1)} MiB; peak (VmHWM) {fmt(peak, 1)} MiB over {total:,} reviews.",
    ]
    if rows:
        first, last = rows[0][-1], rows[-1][-1]
        sec.reading.append(f"Soak: {total:,} reviews in {len(rows)} minutes, RSS {first} MiB after the first "
                           f"minute and {last} MiB after the last (idle {fmt(idle, 1)}).")
    return sec
