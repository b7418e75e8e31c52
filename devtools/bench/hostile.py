"""Part `hostile`: hostile clients against the listener (idle and slow-read floods, unfinished handshakes,
large reviews, odd bodies): what a fresh caller and the probes see while each is held."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from devtools import attacks, procs
from devtools.bench import REPO_ROOT
from devtools.bench.report import Section, fmt, table
from devtools.bench.servers import Pinning, Server, webhook_tree
from devtools.bench.workload import PATH
from devtools.cluster import MEMORY, pod, review_body
from hami_mt_webhook.service import certs

#: The attacks of the hostile part: name, what the floods do, and the floods (kind, connections).
ATTACKS = (
    ("idle + slow-read",
     "600 TLS connections that send nothing, 100 that send a review and never read the answer",
     (("idle", 600), ("slow-read", 100))),
    ("unfinished handshakes", "2,000 TCP connections: half silent, half stopping after half a ClientHello",
     (("silent", 1000), ("half-hello", 1000))),
    ("large reviews", "40 clients posting 2.5 MiB AdmissionReviews in a loop", (("big", 40),)),
)



class Flooder:
    """One `hostile` flood in its own process, pinned beside the load generator."""

    def __init__(self, kind: str, count: int, port: int, cafile: Path, pin: list[str], log: Path) -> None:
        cmd = [*pin, sys.executable, "-m", "devtools.attacks", kind, "--port", str(port),
               "--count", str(count), "--cafile", str(cafile)]
        self.proc = procs.spawn(cmd, log, pipe=True, cwd=REPO_ROOT, mode="wb")

    def wait_holding(self, timeout: float) -> bool:
        return procs.wait_line(self.proc, b"holding", timeout)

    def stop(self) -> dict[str, Any]:
        """Stop the flood; its counts, as it printed them on the way out."""
        procs.signal_group(self.proc.pid, signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            procs.signal_group(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
        with contextlib.suppress(ValueError, IndexError):
            return orjson.loads(out.strip().splitlines()[-1])
        return {}


def rss_mib(pid: int) -> float | None:
    return procs.memory_mib(pid).get("VmRSS")


@dataclass
class Held:
    """What a caller and the probes saw while one attack was held."""

    name: str
    what: str
    reviews: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds), 0: no answer
    correct: int = 0
    probes: list[tuple[int, float]] = field(default_factory=list)
    rss_before: float | None = None
    rss_peak: float | None = None
    #: AFTER_SECONDS after the flood stopped; and how long it took to come within NEAR_IDLE of rss_before.
    rss_after: float | None = None
    near_idle_seconds: float | None = None
    floods: list[dict[str, Any]] = field(default_factory=list)
    held: bool = True


async def _during(port: int, health_port: int, cafile: Path, body: bytes, reviews: int,
                  spacing: float) -> tuple[list[tuple[int, dict, float]], list[tuple[int, float]]]:
    """`reviews` fresh reviews `spacing` s apart, and a /readyz probe every 0.25 s meanwhile."""
    answers: list[tuple[int, dict, float]] = []
    probes: list[tuple[int, float]] = []
    done = asyncio.Event()

    async def probing() -> None:
        while not done.is_set():
            probes.append(await attacks.probe(health_port))
            await asyncio.sleep(0.25)

    prober = asyncio.create_task(probing())
    for _ in range(reviews):
        answers.append(await attacks.fresh_review(port, str(cafile), body))
        await asyncio.sleep(spacing)
    done.set()
    await prober
    return answers, probes


def _hold_attack(name: str, what: str, floods: Sequence[tuple[str, int]], layout: certs.Layout, workdir: Path,
                 pin: Pinning, opts: argparse.Namespace) -> Held:
    result = Held(name, what)
    srv = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, "warning", health=True,
                 tree=webhook_tree(opts, workdir))
    flooders: list[Flooder] = []
    peak = [0.0]
    sampling = True

    def sample() -> None:
        while sampling:
            peak[0] = max(peak[0], rss_mib(srv.proc.pid) or 0.0)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        result.rss_before = rss_mib(srv.proc.pid)
        sampler.start()
        for i, (kind, count) in enumerate(floods):
            flooders.append(Flooder(kind, count, srv.port, layout.ca_cert, pin.load,
                                    workdir / f"flood-{i}.log"))
        result.held = all(f.wait_holding(60) for f in flooders)
        time.sleep(1.0)  # the flood in place: the server has had to deal with it
        body = review_body(pod("slice"))
        answers, result.probes = asyncio.run(_during(srv.port, srv.health_port, layout.ca_cert, body,
                                                     opts.hostile_reviews, 0.5))
        result.reviews = [(status, seconds) for status, _, seconds in answers]
        result.correct = sum(1 for status, answer, _ in answers
                             if status == 200 and answer.get("response", {}).get("patchType") == "JSONPatch")
    finally:
        result.floods = [f.stop() for f in flooders]
        sampling = False
        sampler.join(2)
        result.rss_peak = peak[0] or None
        if result.rss_before is not None and srv.proc.poll() is None:
            result.rss_after, result.near_idle_seconds = _settle(srv.proc.pid, result.rss_before)
        srv.stop()
    return result


#: How long the memory of a server is watched after a flood stops, and what counts as back near idle.
AFTER_SECONDS = 60.0
NEAR_IDLE = 1.15


def _settle(pid: int, before: float) -> tuple[float | None, float | None]:
    """RSS AFTER_SECONDS after the flood (a replica must not keep its high-water mark), and the seconds
    until it first came within NEAR_IDLE of `before` (None: not in that time)."""
    started = time.monotonic()
    near: float | None = None
    while True:
        now = rss_mib(pid)
        waited = time.monotonic() - started
        if near is None and now is not None and now <= before * NEAR_IDLE:
            near = waited
        if now is None or waited >= AFTER_SECONDS:
            return now, near
        time.sleep(1.0)


def _odd_requests(layout: certs.Layout, workdir: Path, pin: Pinning,
                  opts: argparse.Namespace) -> list[list[str]]:
    """Attacks 4-6 and the idle deadline, each one request against a fresh server."""
    srv = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, "warning",
                 tree=webhook_tree(opts, workdir))
    ca = str(layout.ca_cert)
    rows: list[list[str]] = []
    try:
        def with_value(value: str) -> bytes:
            resources = (obj := pod("slice"))["spec"]["containers"][0]["resources"]
            resources["limits"][MEMORY] = value
            resources["requests"].pop(MEMORY)
            return review_body(obj)

        async def go() -> None:
            gz = attacks.post(PATH, review_body(pod("slice")), close=True, extra="Content-Encoding: gzip\r\n")
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port,
                                                           ssl=attacks.client_context(ca))
            writer.write(gz)
            try:
                status, headers, _ = await asyncio.wait_for(attacks.read_answer(reader), 10)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                status, headers = 0, {}
            writer.transport.abort()
            rows.append(["`Content-Encoding: gzip`, plain body", f"HTTP {status}",
                         f"`Server: {headers.get('server', '(none)')}`"])
            status, answer, _ = await attacks.fresh_review(srv.port, ca, with_value("9" * 2_000_000),
                                                           timeout=30)
            size = len(orjson.dumps(answer))
            message = answer.get("response", {}).get("status", {}).get("message", "")
            rows.append(["a 2 MB quantity string", f"HTTP {status}, answer {size:,} bytes",
                         f"denial message {len(message)} characters"])
            for value in ("１", "1_6"):
                status, answer, _ = await attacks.fresh_review(srv.port, ca, with_value(value))
                allowed = answer.get("response", {}).get("allowed")
                rows.append([f"quantity `{value!r}`", f"HTTP {status}",
                             "allowed" if allowed else "denied" if allowed is False else "no answer"])
            idle, kept = await asyncio.gather(
                attacks.time_to_close(srv.port, ca),
                attacks.time_to_close(srv.port, ca, attacks.post(PATH, review_body(pod("slice")))))
            rows.append(["a connection that sends nothing",
                         "closed after " + (f"{idle:.1f} s" if idle else "> 120 s"), ""])
            rows.append(["a kept-alive connection after one review",
                         "closed after " + (f"{kept:.1f} s" if kept else "> 120 s"), ""])

        asyncio.run(go())
    finally:
        srv.stop()
    return rows


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    sec = Section("5. Hostile clients: the listener while an attack is held")
    layout = certs.ensure(workdir / "certs", ips=("127.0.0.1",))
    pin = Pinning.detect()
    print(f"[hostile] {pin.note}", flush=True)
    rows = []
    results = []
    for name, what, floods in ATTACKS:
        print(f"[hostile] {name}: {what}", flush=True)
        held = _hold_attack(name, what, floods, layout, workdir, pin, opts)
        results.append(held)
        served = [s for status, s in held.reviews if status == 200]
        worst_probe = max((s for _, s in held.probes), default=None)
        failed_probes = sum(1 for status, _ in held.probes if status != 200)
        rows.append([name, what, f"{held.correct} of {len(held.reviews)}",
                     fmt(max(served) * 1e3, 0) if served else "-",
                     f"{fmt(worst_probe * 1e3, 0)} ms"
                     + (f" ({failed_probes} failed)" if failed_probes else "")
                     if worst_probe is not None else "-",
                     f"{fmt(held.rss_before, 0)} → {fmt(held.rss_peak, 0)} → {fmt(held.rss_after, 0)}"
                     + (f" (near idle after {held.near_idle_seconds:.0f} s)"
                        if held.near_idle_seconds is not None else ""),
                     "; ".join(f"{f.get('kind')}: {f.get('opened', 0):,} opened" for f in held.floods)
                     + ("" if held.held else " (the flood never reached its size)")])
    sec.lines += [
        "Each attack runs against a fresh webhook server (pinned like part 1) from a separate process "
        "(`python -m devtools.attacks`), which reopens every connection the server closes. Once the "
        f"flood is up, {opts.hostile_reviews} fresh reviews are sent 0.5 s apart, each on a new connection "
        "as kube-apiserver does after its pooled connections were cut, and `/readyz` is probed every 0.25 s. "
        "A review counts as answered correctly when it comes back HTTP 200 with the expected patch. After "
        f"the flood stops, RSS is sampled every second for {AFTER_SECONDS:.0f} s: the last figure, and when it "
        f"first came within {NEAR_IDLE - 1:.0%} of the figure before the flood.",
        "",
        *table(["attack", "what the clients do", "fresh reviews answered", "max latency (ms)",
                "/readyz worst", f"RSS MiB (before → peak → {AFTER_SECONDS:.0f} s after the flood)", "flood"], rows),
        "",
        "Single requests and the idle deadline, against a fresh server:",
        "",
        *table(["client", "answer", "detail"], _odd_requests(layout, workdir, pin, opts)),
    ]
    for held in results:
        served = [s for status, s in held.reviews if status == 200]
        sec.reading.append(
            f"Hostile clients, {held.name}: {held.correct} of {len(held.reviews)} fresh reviews answered"
            + (f" (max {max(served) * 1e3:.0f} ms)" if served else "")
            + f", RSS {fmt(held.rss_before, 0)} → peak {fmt(held.rss_peak, 0)} → "
            f"{fmt(held.rss_after, 0)} MiB {AFTER_SECONDS:.0f} s after the flood.")
    return sec


