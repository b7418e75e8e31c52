"""Part `hostile`: hostile clients against the listeners (idle and slow-read floods, unfinished handshakes,
large reviews, odd bodies on the webhook port; slow headers and idle connections on the probe port): what a
fresh caller and the probes see while each is held, and with `--before REV` the same against REV's server."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from devtools import procs
from devtools.bench.report import Section, fmt, percentile, table
from devtools.bench.servers import Pinning, Server, drop_worktree, webhook_tree, worktree
from devtools.bench.workload import PATH
from devtools.gpus import MEMORY, pod, review_body
from devtools.load import attacks
from hami_mt_webhook.service import certs

#: The attacks of the hostile part: name, what the floods do, the floods (kind, connections), and the port
#: they are held against ("webhook", or "probe": /readyz, /livez, /metrics). The last two are issue 45's:
#: 19,000 connections from one pod, held open on either port.
ATTACKS = (
    ("idle + slow-read",
     "600 TLS connections that send nothing, 100 that send a review and never read the answer",
     (("idle", 600), ("slow-read", 100)), "webhook"),
    ("unfinished handshakes", "2,000 TCP connections: half silent, half stopping after half a ClientHello",
     (("silent", 1000), ("half-hello", 1000)), "webhook"),
    ("large reviews", "40 clients posting 2.5 MiB AdmissionReviews in a loop", (("big", 40),), "webhook"),
    ("19,000 held, webhook port", "10,000 TCP connections stopping after half a ClientHello, 9,000 silent",
     (("half-hello", 10000), ("silent", 9000)), "webhook"),
    ("19,000 held, probe port", "10,000 sending a request line then a header byte every 10 s, 4,500 kept "
     "alive after one GET /livez, 4,500 silent", (("slow-header", 10000), ("plain-idle", 4500),
                                                  ("silent", 4500)), "probe"),
)



#: Where the floods come from: one pod's address, not the one the reviews and probes measured come from.
FLOOD_SOURCE = "127.0.0.2"


def rss_mib(pid: int) -> float | None:
    return procs.memory_mib(pid).get("VmRSS")


@dataclass
class Held:
    """What a caller and the probes saw while one attack was held."""

    name: str
    what: str
    server: str = "now"  # this checkout's, or "webhook@REV" (`--before`)
    target: str = "webhook"
    reviews: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds), 0: no answer
    correct: int = 0
    probes: list[tuple[int, float]] = field(default_factory=list)
    rss_before: float | None = None
    rss_held: float | None = None  # at the end of the hold, the flood still up
    rss_peak: float | None = None
    #: AFTER_SECONDS after the flood stopped; and how long it took to come within NEAR_IDLE of rss_before.
    rss_after: float | None = None
    near_idle_seconds: float | None = None
    floods: list[dict[str, Any]] = field(default_factory=list)
    held: bool = True
    closed: dict[str, float] = field(default_factory=dict)  # the server's connections closed, by port:reason


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


def _hold_attack(name: str, what: str, floods: Sequence[tuple[str, int]], target: str, layout: certs.Layout,
                 workdir: Path, pin: Pinning, opts: argparse.Namespace, before: Path | None = None) -> Held:
    server = "now" if before is None else f"webhook@{opts.before}"
    result = Held(name, what, server, target)
    srv = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, "warning", health=True,
                 tree=before or webhook_tree(opts, workdir), name=server)
    flooders: list[attacks.Flooder] = []
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
        port = srv.health_port if target == "probe" else srv.port
        for i, (kind, count) in enumerate(floods):
            flooders.append(attacks.Flooder(kind, count, port, workdir / f"flood-{i}.log", prefix=pin.load,
                                                cafile=layout.ca_cert, source=FLOOD_SOURCE))
        result.held = all(f.wait_holding(60) for f in flooders)
        time.sleep(1.0)  # the flood in place: the server has had to deal with it
        body = review_body(pod("slice"))
        answers, result.probes = asyncio.run(_during(srv.port, srv.health_port, layout.ca_cert, body,
                                                     opts.hostile_reviews, 0.5))
        result.rss_held = rss_mib(srv.proc.pid)
        result.reviews = [(status, seconds) for status, _, seconds in answers]
        result.correct = sum(1 for status, answer, _ in answers
                             if status == 200 and answer.get("response", {}).get("patchType") == "JSONPatch")
    finally:
        result.floods = [f.stop() for f in flooders]
        result.closed = asyncio.run(_closed(srv.health_port))
        sampling = False
        sampler.join(2)
        result.rss_peak = peak[0] or None
        if result.rss_before is not None and srv.proc.poll() is None:
            result.rss_after, result.near_idle_seconds = _settle(srv.proc.pid, result.rss_before,
                                                                 20.0 if opts.quick else AFTER_SECONDS)
        srv.stop()
    return result


#: How long the memory of a server is watched after a flood stops, and what counts as back near idle.
AFTER_SECONDS = 60.0
NEAR_IDLE = 1.15


#: The series of connections a listener closed, by port (the probe port's exist from issue 45 on).
CLOSED = {b"hami_mt_webhook_connections_closed_total{": "webhook",
          b"hami_mt_webhook_probe_connections_closed_total{": "probe"}


async def _closed(health_port: int) -> dict[str, float]:
    """The connections each listener closed, as "port:reason" -> count, from the server's /metrics."""
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", health_port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            _, _, body = await attacks.read_answer(reader)
            writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
        return {}
    found: dict[str, float] = {}
    for line in body.splitlines():
        for prefix, port in CLOSED.items():
            if line.startswith(prefix):
                labels, _, value = line[len(prefix):].partition(b"} ")
                found[f"{port}:{labels.decode().removeprefix('reason=').strip(chr(34))}"] = float(value)
    return found


def _settle(pid: int, before: float, seconds: float = AFTER_SECONDS) -> tuple[float | None, float | None]:
    """RSS `seconds` after the flood (a replica must not keep its high-water mark), and the seconds until it
    first came within NEAR_IDLE of `before` (None: not in that time)."""
    started = time.monotonic()
    near: float | None = None
    while True:
        now = rss_mib(pid)
        waited = time.monotonic() - started
        if near is None and now is not None and now <= before * NEAR_IDLE:
            near = waited
        if now is None or waited >= seconds:
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


def _ms(seconds: Sequence[float], q: float) -> str:
    return fmt(percentile(sorted(seconds), q) * 1e3, 0) if seconds else "-"


def _row(held: Held) -> list[str]:
    served = [s for status, s in held.reviews if status == 200]
    probes = [s for status, s in held.probes if status == 200]
    failed_probes = sum(1 for status, _ in held.probes if status != 200)
    closed = sorted(held.closed.items(), key=lambda kv: -kv[1])
    return [held.server, held.target, held.name, held.what, f"{held.correct} of {len(held.reviews)}",
            f"{_ms(served, 50)} / {_ms(served, 99)}",
            f"{_ms(probes, 50)} / {_ms(probes, 99)} / {_ms(probes, 100)}"
            + (f" ({failed_probes} of {len(held.probes)} failed)" if failed_probes else ""),
            f"{fmt(held.rss_before, 0)} → {fmt(held.rss_held, 0)} (peak {fmt(held.rss_peak, 0)}) → "
            f"{fmt(held.rss_after, 0)}"
            + (f" (near idle after {held.near_idle_seconds:.0f} s)" if held.near_idle_seconds is not None else ""),
            ", ".join(f"{reason} {n:,.0f}" for reason, n in closed[:6]) or "-",
            "; ".join(f"{f.get('kind')}: {f.get('opened', 0):,} opened" for f in held.floods)
            + ("" if held.held else " (the flood never reached its size)")]


def run(opts: argparse.Namespace, workdir: Path) -> Section:
    sec = Section("5. Hostile clients: the listener while an attack is held")
    layout = certs.ensure(workdir / "certs", ips=("127.0.0.1",))
    pin = Pinning.detect()
    print(f"[hostile] {pin.note}", flush=True)
    before = worktree(opts.before, workdir) if opts.before else None
    results = []
    try:
        for name, what, floods, target in ATTACKS:
            for tree in ([before] if before is not None else []) + [None]:
                print(f"[hostile] {name} ({'now' if tree is None else opts.before}): {what}", flush=True)
                held = _hold_attack(name, what, floods, target, layout, workdir, pin, opts, tree)
                results.append(held)
                print("[hostile]   " + " | ".join(_row(held)[4:]), flush=True)
    finally:
        if before is not None:
            drop_worktree(before)
    after = 20.0 if opts.quick else AFTER_SECONDS
    sec.lines += [
        "Each attack runs against a fresh webhook server (pinned like part 1) from a separate process "
        "(`python -m devtools.load.attacks`), which reopens every connection the server closes; it is held against "
        "the webhook port or the plain-HTTP probe port (/readyz, /livez, /metrics). Once the "
        f"flood is up, {opts.hostile_reviews} fresh reviews are sent 0.5 s apart, each on a new connection "
        "as kube-apiserver does after its pooled connections were cut, and `/readyz` is probed every 0.25 s "
        "(a peer's probe of /peers times out at 0.5 s, and one not answered for 0.75 s counts as silent). "
        "A review counts as answered correctly when it comes back HTTP 200 with the expected patch. RSS is "
        "read before the flood, at the end of the hold and every 0.1 s meanwhile (the peak); after the flood "
        f"stops it is sampled every second for {after:.0f} s: the last figure, and when it first came within "
        f"{NEAR_IDLE - 1:.0%} of the figure before the flood. Connections closed are the server's own counts "
        "(`/metrics`), by port and reason."
        + (f" With `--before {opts.before}` each attack also runs against that revision's server, served from "
           "a worktree, in the same run." if opts.before else ""),
        "",
        *table(["server", "port", "attack", "what the clients do", "fresh reviews answered",
                "review p50 / p99 (ms)", "/readyz p50 / p99 / max (ms)",
                f"RSS MiB (before → held (peak) → {after:.0f} s after the flood)", "closed by the server",
                "flood"], [_row(held) for held in results]),
        "",
        "Single requests and the idle deadline, against a fresh server:",
        "",
        *table(["client", "answer", "detail"], _odd_requests(layout, workdir, pin, opts)),
    ]
    for held in results:
        served = [s for status, s in held.reviews if status == 200]
        sec.reading.append(
            f"Hostile clients, {held.name} ({held.server}): {held.correct} of {len(held.reviews)} fresh reviews "
            "answered" + (f" (max {max(served) * 1e3:.0f} ms)" if served else "")
            + f", RSS {fmt(held.rss_before, 0)} → peak {fmt(held.rss_peak, 0)} → "
            f"{fmt(held.rss_after, 0)} MiB after the flood.")
    return sec
