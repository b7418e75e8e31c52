"""The servers under test, each its own pinned process: `_serve webhook|baseline`; and `_load`, the built-in
load generator for machines without wrk. `python -m devtools.bench _serve ...` runs them (see cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

from devtools import procs
from devtools.bench.report import percentile
from devtools.bench.workload import PATH, cluster
from devtools.gpus import CONFIG
from devtools.paths import REPO_ROOT
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.service import certs
from hami_mt_webhook.service.serving.connections import Limits


@dataclass
class Pinning:
    """The CPUs for the servers and for the load generator (`taskset` prefixes), and a note saying so."""

    server: list[str]
    load: list[str]
    note: str

    @classmethod
    def detect(cls) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not shutil.which("taskset"):
            return cls([], [], "Not pinned: `taskset` is missing, so servers and load generator share the "
                               "CPUs")
        if len(cpus) < 2:
            return cls([], [], f"Not pinned: only {len(cpus)} CPU available, so server and load generator "
                               "share it")
        a, b = cpus[0], cpus[1]
        return cls(["taskset", "-c", str(a)], ["taskset", "-c", str(b)],
                   f"Servers pinned to CPU {a}, load generator to CPU {b} (`taskset -c`)")


def worktree(rev: str, workdir: Path) -> Path:
    """A detached checkout of `rev` in `workdir` (`--before`), for the webhook as it was beside as it is."""
    path = workdir / f"tree-{rev.replace('/', '-')}"
    if not path.exists():
        done = subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO_ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"--before {rev}: git worktree add failed: {done.stderr.strip()}")
    return path


def installed_tree(workdir: Path) -> Path:
    """The webhook as users install it, to serve from: the wheel's package (its rules compiled, setup.py)
    beside this checkout's `devtools`. The checkout itself is installed pure for development
    (`make setup`)."""
    from devtools.builds import wheel

    done = wheel.install_cached()
    probe = subprocess.run([str(done.python), "-c",
                            "import hami_mt_webhook, sys; print(hami_mt_webhook.__file__)"],
                           capture_output=True, text=True, check=True, cwd="/")
    site = Path(probe.stdout.strip()).parents[1]
    tree = workdir / "installed"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    shutil.copytree(REPO_ROOT / "devtools", tree / "devtools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(site / "hami_mt_webhook", tree / "hami_mt_webhook",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for lib in site.glob("hami_mt_webhook__mypyc.*"):
        shutil.copy2(lib, tree / lib.name)
    return tree


def webhook_tree(opts: argparse.Namespace, workdir: Path) -> Path:
    """Where the webhook server of a part is served from: the installed wheel (made once per run), or with
    `--pure` this checkout's sources."""
    if opts.pure:
        return REPO_ROOT
    tree = workdir / "installed"
    return tree if (tree / "hami_mt_webhook").is_dir() else installed_tree(workdir)


def drop_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, capture_output=True)


class Process:
    """A server under test in its own process, on a loopback port, that prints `ready` on stdout once it
    listens: the harness loads any of them alike (`url` + `path`), whoever wrote the server."""

    #: The path its reviews are POSTed to.
    path = PATH

    def __init__(self, name: str, cmd: list[str], port: int, log: Path, *, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.port, self.log = name, port, log
        # A killed benchmark must not leave listeners behind.
        self.proc = procs.spawn(cmd, log, pipe=True, cwd=cwd, env=env, mode="wb")
        if not procs.wait_line(self.proc, b"ready", 60.0):
            self.stop()
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the {self.name} server did not start (exit {self.proc.returncode}):\n{tail}")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def peak_rss_mib(self) -> float | None:
        return procs.memory_mib(self.proc.pid).get("VmHWM")

    def stop(self) -> None:
        procs.terminate(self.proc)  # SIGTERM first: a profiled server writes its stats then
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Server(Process):
    """One of this project's benchmark servers (`_serve webhook|baseline`) in its own pinned process."""

    def __init__(self, kind: str, layout: certs.Layout, workdir: Path, pin: list[str], s5000: int, s4000: int,
                 log_level: str, profile: Path | None = None, health: bool = False, tree: Path = REPO_ROOT,
                 name: str | None = None) -> None:
        self.kind = kind
        name = name or kind  # "webhook@<rev>" for the webhook of another revision (`tree`, a worktree)
        port, health_port = procs.free_ports(2)
        self.health_port = health_port if health else 0
        log = workdir / f"{name.replace('@', '-')}{'-profiled' if profile else ''}.log"
        cmd = [*pin, sys.executable, "-m", "devtools.bench", "_serve", kind, "--port", str(port),
               "--cert", str(layout.tls_cert), "--key", str(layout.tls_key), "--s5000", str(s5000),
               "--s4000", str(s4000), "--log-level", log_level]
        if profile:
            cmd += ["--profile", str(profile)]
        if health:
            cmd += ["--health-port", str(self.health_port)]
        # `-m` puts the working directory first on sys.path, so `tree`'s package is the one served.
        super().__init__(name, cmd, port, log, cwd=tree)


async def serve(kind: str, port: int, cert: str, key: str, s5000: int, s4000: int, log_level: str,
                health_port: int = 0) -> None:
    """A benchmark server until SIGTERM: the project's AdmissionServer (with /readyz on `health_port`
    when given), or a bare aiohttp TLS baseline."""
    import aiohttp.web

    from hami_mt_webhook.service import logs
    from hami_mt_webhook.service.serving import probes, tls
    from hami_mt_webhook.service.serving.server import AdmissionServer
    from hami_mt_webhook.service.state import State

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if kind == "webhook":
        logs.setup(log_level, "json")
        state = State(CONFIG, ClusterView.from_nodes(cluster(s5000, s4000), CONFIG))
        state.metrics.ready.set(1)
        srv = AdmissionServer(state, addr="127.0.0.1", port=port, certfile=cert, pkeyfile=key,
                              reload_interval=3600.0,
                              limits=dataclasses.replace(Limits(), drain_seconds=0.2, shutdown_timeout=1.0))
        gen = cast(AsyncGenerator[Any, None], srv(None))  # AdmissionServer.__call__ is an async generator
        await gen.__anext__()
        health = []
        if health_port:  # as `serve` runs them: the probes on a plain-HTTP listener with the same limits
            health = await probes.listen(state, probes.routes(state), "127.0.0.1", [health_port], srv.limits)
        print("ready", flush=True)
        try:
            await stop.wait()
        finally:
            await gen.aclose()
            await probes.stop(health)
        return

    constant = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": "00000000-0000-4000-8000-000000000000", "allowed": True}})

    async def answer(request: aiohttp.web.Request) -> aiohttp.web.Response:
        await request.read()
        return aiohttp.web.Response(body=constant, content_type="application/json")

    app = aiohttp.web.Application(client_max_size=Limits().max_body)
    app.router.add_post("/{id}", answer)
    runner = aiohttp.web.AppRunner(app, access_log=None, keepalive_timeout=75, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.tls_context(cert, key)).start()
        print("ready", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


def _run(coro: Any) -> Any:
    """asyncio's own loop, which `serve` runs on."""
    return asyncio.run(coro)


def internal(argv: list[str]) -> int:
    """Entry points of the helper processes: `_serve webhook|baseline ...` and `_load ...`."""
    p = argparse.ArgumentParser(prog="devtools.bench " + argv[0])
    if argv[0] == "_serve":
        p.add_argument("kind", choices=["webhook", "baseline"])
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--cert", required=True)
        p.add_argument("--key", required=True)
        p.add_argument("--s5000", type=int, default=200)
        p.add_argument("--s4000", type=int, default=100)
        p.add_argument("--log-level", default="info")
        p.add_argument("--profile", help="run under cProfile and write the stats here on SIGTERM")
        p.add_argument("--health-port", type=int, default=0)
        a = p.parse_args(argv[1:])
        prof = cProfile.Profile() if a.profile else None
        if prof:
            prof.enable()
        _run(serve(a.kind, a.port, a.cert, a.key, a.s5000, a.s4000, a.log_level, a.health_port))
        if prof:
            prof.disable()
            prof.dump_stats(a.profile)
        return 0
    p.add_argument("--url", required=True)
    p.add_argument("--bodies", required=True)
    p.add_argument("--cafile", required=True)
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--duration", type=float, required=True)
    a = p.parse_args(argv[1:])
    payloads = [s.encode() for s in orjson.loads(Path(a.bodies).read_bytes())]
    result = _run(python_load(a.url, payloads, a.cafile, a.connections, a.duration))
    print(orjson.dumps(result).decode(), flush=True)
    return 0



async def python_load(url: str, payloads: list[bytes], cafile: str, connections: int,
                      duration: float) -> dict[str, Any]:
    """The fallback load generator: `connections` keep-alive connections POSTing in a closed loop."""
    import aiohttp

    ctx = ssl.create_default_context(cafile=cafile)
    latencies: list[float] = []
    errors = 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=connections, ssl=ctx)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker(offset: int, end: float) -> None:
            nonlocal errors
            i = offset
            while True:
                started = time.perf_counter()
                if started >= end:
                    return
                body = payloads[i % len(payloads)]
                i += 1
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)

        warm = time.perf_counter() + min(1.0, duration / 5)  # open the connections, then measure afresh
        await asyncio.gather(*(worker(i, warm) for i in range(connections)))
        latencies.clear()
        errors = 0
        started = time.perf_counter()
        await asyncio.gather(*(worker(i, started + duration) for i in range(connections)))
        seconds = time.perf_counter() - started
    ordered = sorted(x * 1e3 for x in latencies)
    return {"requests": len(ordered), "seconds": seconds, "errors": errors, "p50": percentile(ordered, 50),
            "p99": percentile(ordered, 99), "p999": percentile(ordered, 99.9),
            "max": ordered[-1] if ordered else 0}

