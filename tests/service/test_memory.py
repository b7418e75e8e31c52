"""A replica's memory comes back after large reviews: measured on a real server process, as `serve` runs
its listener (the benchmark's server), from /proc."""

from __future__ import annotations

import asyncio
import time

from devtools import procs
from devtools.bench.servers import Server
from devtools.load import attacks
from hami_mt_webhook.service import certs

#: How far above its idle RSS a replica may stay once large reviews have stopped (issue 34).
WITHIN_MIB = 15.0


def rss_mib(pid: int) -> float:
    return procs.memory_mib(pid)["VmRSS"]


async def test_rss_returns_near_idle_after_large_reviews_from_several_clients(certs_dir: certs.Layout, tmp_path):
    server = Server("webhook", certs_dir, tmp_path, [], 20, 10, "warning")
    try:
        pid = server.proc.pid
        idle = rss_mib(pid)
        flood = attacks.Flood("big", server.port, 8, str(certs_dir.ca_cert), attacks.review(2.4))
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(6.0, stop.set)
        await flood.run(stop)
        peak = procs.memory_mib(pid)["VmHWM"]
        assert flood.answered >= 8 and flood.failed == 0
        assert peak > idle + WITHIN_MIB, "the reviews did not raise the memory past the bound: nothing to measure"
        started = time.monotonic()
        while (now := rss_mib(pid)) > idle + WITHIN_MIB and time.monotonic() - started < 30:
            await asyncio.sleep(0.5)
        assert now <= idle + WITHIN_MIB, f"RSS {idle:.0f} MiB idle, {peak:.0f} at the peak, {now:.0f} 30 s after"
    finally:
        server.stop()
