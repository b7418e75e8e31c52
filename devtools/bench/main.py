"""Benchmark: the webhook beside a bare aiohttp TLS server, the rules in process, the node index,
and the webhook as kube-apiserver measures it.

    python -m devtools.bench                          # all four parts, 10 s per load point
    python -m devtools.bench --quick --skip-apiserver # 2 s per point, no control plane
    python -m devtools.bench --write docs/PERFORMANCE.md

It prints figures and asserts nothing: a benchmark, not a timed test. Only 127.0.0.1 is contacted.
Servers run pinned to one CPU and the load generator to another (`taskset`), so on a 2-core machine
they never share a core; whatever else runs on the machine still shows in the numbers, which is why
the load average is recorded beside them.

Parts (`--parts`):
  http       wrk (or the built-in Python client) against the webhook and a bare aiohttp TLS server
  inprocess  microseconds per review of review.handle and rules.mutate, and of the server's metrics and log line
  index      the node index at 100 / 1,000 / 10,000 nodes: memory, build time, per-admission lookup
  apiserver  pods created through a local kube-apiserver; its webhook-latency histograms
  hostile    hostile clients against the listener (idle and slow-read floods, unfinished handshakes,
             large reviews, odd bodies): what a fresh caller and the probes see while each is held
  scale      the whole process on 1,000 / 5,000 / 10,000 real-sized nodes: start-up, memory, churn, restarts
  hops       floor, shipped and forced-validating configurations interleaved through kube-apiserver (hops.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime as dt
import functools
import gc
import http.client
import importlib.metadata
import io
import logging
import math
import os
import platform
import pstats
import re
import secrets
import selectors
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hami_mt_webhook.admission import review
from hami_mt_webhook.rules import pods as rules
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import CORES_PER_CARD, Config
from hami_mt_webhook.service import certs
from hami_mt_webhook.service.listener import Limits

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("http", "inprocess", "index", "apiserver", "hostile", "scale", "hops")
PATH = "/mutate-pods"

# --- the workload: a realistic cluster and five kinds of review ---------------------------------------

CONFIG = Config()
VGPU, MEMORY, CORE = CONFIG.slices
WHOLE = CONFIG.whole_card[0]
PRODUCT = "mthreads.com/gpu.product"
#: name, sliced cards per node, 512 MiB units per card
MODELS = {"S5000": ("MTT-S5000", 8, 160), "S4000": ("MTT-S4000", 1, 96)}

KINDS = ("slice", "exclusive", "snap", "multi-card", "denied")
DESCRIBE = {
    "slice": "`vgpu 1, sgpu-memory 32, sgpu-core 8`: kept, requests = limits, scheduler set",
    "exclusive": "`vgpu 1` alone, nodeSelector MTT-S5000: filled to 160 / 16 (scans the nodes)",
    "snap": "`vgpu 1, sgpu-memory 20, sgpu-core 4`: snapped up to 32, with a warning",
    "multi-card": "`vgpu 2`, nodeSelector MTT-S5000: filled to 320 / 32, annotation (scans the nodes)",
    "denied": "`mthreads.com/gpu 1` and `vgpu 1` in one container: denied",
}
EXPECT = {"slice": "patched", "exclusive": "patched", "snap": "patched", "multi-card": "patched", "denied": "denied"}


def node(name: str, model: str, zone: str) -> dict[str, Any]:
    """A Node as `kubectl get node -o json` shows it, with the labels a GPU node usually carries."""
    product, cards, per_card = MODELS[model]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
            "node.kubernetes.io/instance-type": f"mtt-{model.lower()}-x{cards}",
            "topology.kubernetes.io/region": "cn-north", "topology.kubernetes.io/zone": zone,
            "mthreads.com/gpu-node": "true", PRODUCT: product, "mthreads.com/gpu.count": str(cards),
            "mthreads.com/driver-version": "3.1.0"}},
        "status": {"capacity": {
            "cpu": "128" if cards > 1 else "64", "memory": "1Ti" if cards > 1 else "512Gi", "pods": "110",
            "ephemeral-storage": "3750Gi", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
            WHOLE: str(cards), CORE: str(CORES_PER_CARD * cards), MEMORY: str(per_card * cards)}},
    }


def cluster(s5000: int, s4000: int) -> list[dict[str, Any]]:
    """`s5000` nodes with eight 160-unit cards and `s4000` nodes with one 96-unit card, over three zones."""
    zones = ("cn-north-1a", "cn-north-1b", "cn-north-1c")
    out = [node(f"s5000-{i:05d}", "S5000", zones[i % 3]) for i in range(s5000)]
    out += [node(f"s4000-{i:05d}", "S4000", zones[i % 3]) for i in range(s4000)]
    return out


def pod(kind: str, name: str = "trainer", namespace: str = "bench", *, selector: bool | None = None,
        affinity: bool = False) -> dict[str, Any]:
    """A Pod as the API server hands it to admission (defaulted, requests copied from limits).

    `selector` overrides whether the pod pins MTT-S5000 with a nodeSelector; `affinity` pins it
    with a required nodeAffinity term instead.
    """
    slices: dict[str, str] = {
        "slice": {VGPU: "1", MEMORY: "32", CORE: "8"},
        "exclusive": {VGPU: "1"},
        "snap": {VGPU: "1", MEMORY: "20", CORE: "4"},
        "multi-card": {VGPU: "2"},
        "denied": {WHOLE: "1", VGPU: "1"},
    }[kind]
    main = {"cpu": "8", "memory": "32Gi", **slices}
    side = {"cpu": "100m", "memory": "128Mi"}
    common = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
              "imagePullPolicy": "IfNotPresent"}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "trainer", "image": "registry.example.com/mthreads/musa-pytorch:4.0.0-py311",
             "command": ["torchrun"], "args": ["--nproc-per-node=1", "train.py", "--config=/etc/train/config.yaml"],
             "ports": [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}],
             "env": [{"name": "MUSA_VISIBLE_DEVICES", "value": "all"},
                     {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                                     "fieldPath": "metadata.name"}}}],
             "resources": {"limits": dict(main), "requests": dict(main)},
             "volumeMounts": [{"name": "config", "mountPath": "/etc/train", "readOnly": True},
                              {"name": "data", "mountPath": "/data"}], **common},
            {"name": "log-shipper", "image": "registry.example.com/infra/fluent-bit:3.2",
             "resources": {"limits": dict(side), "requests": dict(side)},
             "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}], **common},
        ],
        "volumes": [{"name": "config", "configMap": {"name": "trainer-config", "defaultMode": 420}},
                    {"name": "data", "emptyDir": {}}],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
        "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300} for t in ("not-ready", "unreachable")],
    }
    if selector if selector is not None else kind in ("exclusive", "multi-card"):
        spec["nodeSelector"] = {PRODUCT: "MTT-S5000"}
    if affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": PRODUCT, "operator": "In", "values": ["MTT-S5000"]}]}]}}}
    metadata = {"name": name, "namespace": namespace, "labels": {"app": "trainer", "team": "ml-platform"},
                "annotations": {"bench.hami-mt/kind": kind}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review_body(obj: dict[str, Any], uid: str = "00000000-0000-4000-8000-000000000000") -> bytes:
    """An AdmissionReview v1 CREATE request for `obj`, shaped like kube-apiserver's."""
    meta = obj["metadata"]
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    request = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "name": meta.get("name"), "namespace": meta.get("namespace"), "operation": "CREATE",
               "userInfo": {"username": "system:serviceaccount:ml:trainer-controller",
                            "uid": "3f6c1a8e-7d1b-4c55-9f3a-2b8f5d6e7a10",
                            "groups": ["system:serviceaccounts", "system:serviceaccounts:ml", "system:authenticated"]},
               "object": obj, "oldObject": None, "dryRun": False,
               "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}
    return orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})


def bodies() -> list[bytes]:
    """The five reviews of the mix, in KINDS order."""
    return [review_body(pod(kind), f"00000000-0000-4000-8000-{i:012d}") for i, kind in enumerate(KINDS)]


def outcome(decision: Any) -> str:
    if decision is None:
        return "error"
    if not decision.allowed:
        return "denied"
    return "patched" if decision.patch else "allowed"


# --- small helpers ------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values) / 100 - 1e-9))  # 99.9 * 1000 / 100 is 999.0000000000001
    return sorted_values[min(rank, len(sorted_values)) - 1]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@dataclass
class Section:
    """One part's output: Markdown lines, and sentences for the summary at the top."""

    title: str
    lines: list[str] = field(default_factory=list)
    reading: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        return "\n".join([f"## {self.title}", "", *self.lines, ""])


# --- part 1: loopback HTTPS ---------------------------------------------------------------------------


@dataclass
class Load:
    server: str
    connections: int
    requests: int
    seconds: float
    rps: float
    p50: float  # milliseconds
    p99: float
    p999: float
    max: float
    errors: int
    tool: str


@dataclass
class Pinning:
    server: list[str]
    load: list[str]
    note: str

    @classmethod
    def detect(cls) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not shutil.which("taskset"):
            return cls([], [], "Not pinned: `taskset` is missing, so servers and load generator share the CPUs")
        if len(cpus) < 2:
            return cls([], [], f"Not pinned: only {len(cpus)} CPU available, so server and load generator share it")
        a, b = cpus[0], cpus[1]
        return cls(["taskset", "-c", str(a)], ["taskset", "-c", str(b)],
                   f"Servers pinned to CPU {a}, load generator to CPU {b} (`taskset -c`)")


class Server:
    """One benchmark server (`_serve webhook|baseline`) in its own pinned process."""

    def __init__(self, kind: str, layout: certs.Layout, workdir: Path, pin: list[str], s5000: int, s4000: int,
                 log_level: str, profile: Path | None = None, health: bool = False) -> None:
        self.kind, self.port = kind, free_port()
        self.health_port = free_port() if health else 0
        self.log = workdir / f"{kind}{'-profiled' if profile else ''}.log"
        cmd = [*pin, sys.executable, "-m", "devtools.bench", "_serve", kind, "--port", str(self.port),
               "--cert", str(layout.tls_cert), "--key", str(layout.tls_key), "--s5000", str(s5000),
               "--s4000", str(s4000), "--log-level", log_level]
        if profile:
            cmd += ["--profile", str(profile)]
        if health:
            cmd += ["--health-port", str(self.health_port)]
        from devtools.controlplane import _die_with_parent  # a killed benchmark must not leave listeners behind

        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=REPO_ROOT, preexec_fn=_die_with_parent())
        self._wait_ready(60.0)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if sel.select(timeout) and self.proc.stdout.readline().strip() == b"ready":
                return
        self.stop()
        tail = self.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the {self.kind} server did not start (exit {self.proc.returncode}):\n{tail}")

    def peak_rss_mib(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def post_once(port: int, body: bytes, cafile: Path) -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(cafile))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, orjson.loads(resp.read())
    finally:
        conn.close()


def lua_string(data: bytes) -> str:
    out = []
    for b in data:
        if b in (0x22, 0x5C):  # " and \
            out.append("\\" + chr(b))
        elif 32 <= b < 127:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03d}")
    return '"' + "".join(out) + '"'


def wrk_script(payloads: Sequence[bytes]) -> str:
    """A wrk script that POSTs the payloads in turn, and prints exact percentiles when done."""
    items = ",\n".join("  " + lua_string(p) for p in payloads)
    return f"""-- generated by devtools.bench
local bodies = {{
{items}
}}
local prepared = {{}}
local n = 0

function init(args)
  for k, body in ipairs(bodies) do
    prepared[k] = wrk.format("POST", "{PATH}", {{["Content-Type"] = "application/json"}}, body)
  end
end

function request()
  n = n % #prepared + 1
  return prepared[n]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH p50=%.1f p99=%.1f p999=%.1f max=%.1f requests=%d duration=%.1f errors=%d\\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout))
end
"""


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


def parse_wrk(output: str, server: str, connections: int) -> Load:
    """Requests/s and the `--latency` distribution from wrk's report, p99.9 from the script's done()."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    dist = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)$", output, re.M))
    done = dict(re.findall(r"(\w+)=([\d.]+)", output[output.index("BENCH "):]))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    errors = int(non2xx.group(1)) if non2xx else 0
    errors += sum(int(x) for x in sock.groups()) if sock else 0
    return Load(server, connections, int(done["requests"]), float(done["duration"]) / 1e6, rps,
                _ms(dist["50"]), _ms(dist["99"]), float(done["p999"]) / 1e3, float(done["max"]) / 1e3, errors, "wrk")


def run_wrk(url: str, script: Path, connections: int, duration: float, pin: list[str], server: str) -> Load:
    cmd = [*pin, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
           "--latency", "-s", str(script), url + PATH]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    if done.returncode != 0 or "BENCH " not in done.stdout:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return parse_wrk(done.stdout, server, connections)


def run_python_load(url: str, payload_file: Path, cafile: Path, connections: int, duration: float,
                    pin: list[str], server: str) -> Load:
    cmd = [*pin, sys.executable, "-m", "devtools.bench", "_load", "--url", url + PATH,
           "--bodies", str(payload_file), "--cafile", str(cafile), "--connections", str(connections),
           "--duration", str(duration)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, cwd=REPO_ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    r = orjson.loads(done.stdout.strip().splitlines()[-1])
    return Load(server, connections, r["requests"], r["seconds"], r["requests"] / r["seconds"], r["p50"], r["p99"],
                r["p999"], r["max"], r["errors"], "python")


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
            "p99": percentile(ordered, 99), "p999": percentile(ordered, 99.9), "max": ordered[-1] if ordered else 0}


def part_http(opts: argparse.Namespace, workdir: Path) -> Section:
    sec = Section("1. Loopback HTTPS: the webhook beside a bare aiohttp TLS server")
    layout = certs.ensure(workdir / "certs", ips=("127.0.0.1",))
    payloads = bodies()
    pin = Pinning.detect()
    use_wrk = opts.load_generator == "wrk" or (opts.load_generator == "auto" and shutil.which("wrk"))
    if opts.load_generator == "wrk" and not shutil.which("wrk"):
        raise SystemExit("--load-generator wrk: wrk is not installed (Debian: apt-get install wrk)")
    script = workdir / "mix.lua"
    script.write_text(wrk_script(payloads))
    payload_file = workdir / "mix.json"
    payload_file.write_bytes(orjson.dumps([p.decode() for p in payloads]))
    why = "wrk was not found" if opts.load_generator == "auto" else "`--load-generator python` was given"
    tool_note = ("wrk 1 thread (`-t1`), closed loop, the 5 bodies in turn through a Lua `request()`; "
                 "p50/p99 from `--latency`, p99.9 and max from the script's `done()`") if use_wrk else \
        (f"**{why}**, so the built-in asyncio/aiohttp client (one process, keep-alive connections in a closed "
         "loop) generated the load; it is much slower than wrk, so the figures show the client's limit as much "
         "as the servers'")
    print(f"[http] load generator: {'wrk' if use_wrk else f'python ({why})'}; {pin.note}", flush=True)

    servers: dict[str, Server] = {}
    results: list[Load] = []
    try:
        for kind in ("webhook", "baseline"):
            servers[kind] = Server(kind, layout, workdir, pin.server, opts.s5000, opts.s4000, opts.log_level)
        for kind, payload in zip(KINDS, payloads, strict=True):  # the webhook answers as the mix says
            status, answer = post_once(servers["webhook"].port, payload, layout.ca_cert)
            got = answer.get("response", {})
            seen = "denied" if not got.get("allowed") else ("patched" if "patch" in got else "allowed")
            if status != 200 or seen != EXPECT[kind]:
                raise RuntimeError(f"the webhook answered the {kind} review with HTTP {status}, {seen}: {answer}")
        status, _ = post_once(servers["baseline"].port, payloads[0], layout.ca_cert)
        if status != 200:
            raise RuntimeError(f"the baseline server answered HTTP {status}")

        def measure(kind: str, connections: int, duration: float) -> Load:
            url = servers[kind].url
            if use_wrk:
                return run_wrk(url, script, connections, duration, pin.load, kind)
            return run_python_load(url, payload_file, layout.ca_cert, connections, duration, pin.load, kind)

        for kind in servers:  # warm-up: first handshakes, allocator and caches; not recorded
            measure(kind, max(opts.connections), 1.0)
        for connections in opts.connections:  # interleaved, so drift on the machine hits both alike
            for kind in ("webhook", "baseline"):
                load = measure(kind, connections, opts.duration)
                results.append(load)
                print(f"[http] {kind:8} c={connections:<3} {load.rps:9,.0f} reviews/s  p50 {load.p50:6.2f} ms  "
                      f"p99 {load.p99:6.2f} ms  p99.9 {load.p999:6.2f} ms  errors {load.errors}", flush=True)
        rss = {kind: s.peak_rss_mib() for kind, s in servers.items()}
        for s in servers.values():
            s.stop()
        if opts.profile:  # a separate run: cProfile slows the server, so it never touches the figures above
            stats = workdir / "webhook.pstats"
            profiled = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, opts.log_level, stats)
            try:
                measure_url = profiled.url
                if use_wrk:
                    run_wrk(measure_url, script, 16, opts.duration, pin.load, "webhook")
                else:
                    run_python_load(measure_url, payload_file, layout.ca_cert, 16, opts.duration, pin.load, "webhook")
            finally:
                profiled.stop()
            profile_text = stats_lines(stats, "tottime", 30)
    finally:
        for s in servers.values():
            s.stop()
    log_bytes = servers["webhook"].log.stat().st_size if "webhook" in servers else 0
    total = sum(r.requests for r in results if r.server == "webhook") + 1  # +1: never divide by zero

    sec.lines += [
        f"Cluster in the webhook's view: {opts.s5000} S5000 nodes (8 cards of 160) and {opts.s4000} S4000 nodes "
        f"(1 card of 96), 11 labels each. Both servers: {'uvloop' if _has_uvloop() else 'asyncio'}, TLS from "
        "`server.tls_context` (TLS 1.3, ECDHE + AES-GCM), HTTP/1.1 keep-alive, no access log, one process. The "
        "webhook is `server.AdmissionServer` as `serve` runs it (its listener with the default limits, metrics, "
        f"`review.handle`), logging at `{opts.log_level}` (JSON lines to a file, as `serve` does to stderr); the "
        "baseline is a plain aiohttp `TCPSite` that reads the body and returns a constant allowed AdmissionReview.",
        "",
        f"Load: {tool_note}. {pin.note}. {opts.duration:g} s per point, after a 1 s warm-up per server; "
        "webhook and baseline points interleaved.",
        "",
        "The mix (POST /mutate-pods, " + ", ".join(f"{k} {len(p):,} B" for k, p in zip(KINDS, payloads, strict=True))
        + "):",
        "",
        *[f"- {k}: {DESCRIBE[k]}" for k in KINDS],
        "",
        *table(["connections", "server", "reviews/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors"],
               [(r.connections, r.server, f"{r.rps:,.0f}", fmt(r.p50), fmt(r.p99), fmt(r.p999), fmt(r.max), r.errors)
                for r in results]),
        "",
    ]
    by = {(r.server, r.connections): r for r in results}
    ratio_rows = []
    for c in opts.connections:
        w, b = by.get(("webhook", c)), by.get(("baseline", c))
        if w and b and b.rps and w.rps:
            extra = (1 / w.rps - 1 / b.rps) * 1e6
            ratio_rows.append((c, f"{w.rps / b.rps:.2f}", f"{w.p50 / b.p50:.2f}" if b.p50 else "–",
                               f"{w.p99 / b.p99:.2f}" if b.p99 else "–", f"{extra:,.0f}"))
    sec.lines += [
        "Webhook relative to the baseline (the last column is 1/rps(webhook) − 1/rps(baseline): the server time "
        "one review adds over bare aiohttp + TLS, meaningful once the server's core is saturated):",
        "",
        *table(["connections", "reviews/s ratio", "p50 ratio", "p99 ratio", "µs added per review"], ratio_rows),
        "",
        f"Peak RSS (VmHWM): webhook {fmt(rss.get('webhook'), 1)} MiB, baseline {fmt(rss.get('baseline'), 1)} MiB. "
        f"The webhook wrote {log_bytes / total:.0f} bytes of log per review.",
    ]
    if opts.profile:
        sec.lines += ["", "cProfile of the webhook server process under 16 connections for "
                      f"{opts.duration:g} s (a separate run; profiling slows it), top 30 by own time:", "",
                      "```", *profile_text, "```"]
    if ratio_rows:
        top = max(opts.connections)
        w, b = by[("webhook", top)], by[("baseline", top)]
        sec.reading.append(
            f"Over loopback HTTPS at {top} connections the webhook answers {w.rps:,.0f} reviews/s, "
            f"{w.rps / b.rps:.0%} of a bare aiohttp TLS server on the same core ({b.rps:,.0f}/s); p99 "
            f"{w.p99:.1f} ms against {b.p99:.1f} ms. Each review costs about {(1 / w.rps - 1 / b.rps) * 1e6:,.0f} µs "
            "of server CPU above the baseline.")
        one = by.get(("webhook", min(opts.connections)))
        if one:
            sec.reading.append(f"One connection at a time sees p50 {one.p50:.2f} ms, p99 {one.p99:.2f} ms.")
    if not use_wrk:
        sec.reading.append(f"Part 1 used the Python load generator ({why}), which limits the rates shown.")
    return sec


#: Everything from this line on in the written report is kept when the benchmark writes it again.
NOTES_MARKER = "<!-- analysis: kept across reruns -->"


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


# --- the server processes (`_serve`, `_load`) -----------------------------------------------------------


async def serve(kind: str, port: int, cert: str, key: str, s5000: int, s4000: int, log_level: str,
                health_port: int = 0) -> None:
    """A benchmark server until SIGTERM: the project's AdmissionServer (with /readyz on `health_port`
    when given), or a bare aiohttp TLS baseline."""
    import aiohttp.web

    from hami_mt_webhook.service import logs, server

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if kind == "webhook":
        logs.setup(log_level, "json")
        state = server.State(CONFIG, ClusterView.from_nodes(cluster(s5000, s4000), CONFIG))
        state.metrics.ready.set(1)
        srv = server.AdmissionServer(state, addr="127.0.0.1", port=port, certfile=cert, pkeyfile=key,
                                     reload_interval=3600.0,
                                     limits=dataclasses.replace(Limits(), drain_seconds=0.2, shutdown_timeout=1.0))
        gen = srv(None)
        await gen.__anext__()
        health = None
        if health_port:
            health = aiohttp.web.AppRunner(await server.health_app(state), access_log=None)
            await health.setup()
            await aiohttp.web.TCPSite(health, "127.0.0.1", health_port).start()
        print("ready", flush=True)
        try:
            await stop.wait()
        finally:
            await gen.aclose()
            if health is not None:
                await health.cleanup()
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
        await aiohttp.web.TCPSite(runner, "127.0.0.1", port, ssl_context=server.tls_context(cert, key)).start()
        print("ready", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


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


# --- part 2: in-process cost --------------------------------------------------------------------------


def part_inprocess(opts: argparse.Namespace) -> Section:
    from hami_mt_webhook.service import logs, server
    from hami_mt_webhook.service.metrics import Metrics

    sec = Section("2. In process: the rules engine alone")
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
            t_handle = per_call(functools.partial(review.handle, body, "mutate-pods", view, CONFIG), repeat, target)
            t_mutate = per_call(functools.partial(rules.mutate, obj, view, CONFIG), repeat, target)
            if outcome(rules.mutate(obj, view, CONFIG)) != seen:
                raise RuntimeError(f"rules.mutate changed its input: the {kind} pod no longer gives {seen}")
            t_validate = math.nan
            decision = reply.decision
            if decision is not None and decision.allowed and decision.object is not None:
                admitted = review_body(decision.object)
                t_validate = per_call(functools.partial(review.handle, admitted, "validate-pods", view, CONFIG),
                                      repeat, target)
            t_metrics = per_call(functools.partial(metrics.review, "mutate-pods", reply.request, decision, 1e-3),
                                 repeat, target)
            t_log = 0.0
            if decision is not None and (decision.patch or not decision.allowed):
                t_log = per_call(functools.partial(server._log, "mutate-pods", reply.request or {}, decision),
                                 repeat, target)
            rows.append((kind, f"{len(body):,}", seen, fmt(t_handle * 1e6, 1), fmt(t_mutate * 1e6, 1),
                         fmt((t_handle - t_mutate) * 1e6, 1), fmt(t_validate * 1e6, 1), fmt(t_metrics * 1e6, 1),
                         fmt(t_log * 1e6, 1)))
            costs[kind] = t_handle
            totals["handle"] += t_handle
            totals["mutate"] += t_mutate
            totals["validate"] += 0 if math.isnan(t_validate) else t_validate
            totals["server"] += t_metrics + t_log
            print(f"[inprocess] {kind:10} handle {t_handle * 1e6:7.1f} µs  rules.mutate {t_mutate * 1e6:7.1f} µs  "
                  f"validate {t_validate * 1e6:7.1f} µs  metrics {t_metrics * 1e6:5.1f} µs  log {t_log * 1e6:5.1f} µs",
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
        f"Same view as part 1 ({opts.s5000} + {opts.s4000} nodes). Best of {repeat} repeats of ~{target:g} s each, "
        "gc enabled, one thread. `review.handle` is the whole seam the server calls (orjson parse, the rules, "
        "the response with its base64 JSON Patch, orjson dump); `rules.mutate` takes the already parsed pod. "
        "*validate* is `review.handle` on /validate-pods with the admitted (patched) pod, which the API "
        "server sends next. *metrics* and *log* are what `AdmissionServer._serve_review` does around "
        "`handle`: `Metrics.review` and, for a patch or a denial, one JSON log line at INFO (to /dev/null here).",
        "",
        *table(["review", "body bytes", "outcome", "review.handle µs", "rules.mutate µs", "parse + respond µs",
                "validate µs", "metrics µs", "log line µs"], rows),
        "",
        f"One core running only `review.handle` would answer about {1 / mean['handle']:,.0f} mutating reviews/s "
        "of this mix.",
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
    return [f"cProfile of `review.handle` over the mix ({rounds:,} rounds of 5 reviews), top {top} by cumulative "
            "time (profiling overhead inflates small functions):", "", "```", *text, "```"]


def stats_lines(source: cProfile.Profile | Path, sort: str, top: int) -> list[str]:
    """The pstats table (header and rows), printed as it is returned."""
    out = io.StringIO()
    stats = pstats.Stats(str(source) if isinstance(source, Path) else source, stream=out)
    stats.strip_dirs().sort_stats(sort).print_stats(top)
    text = out.getvalue().strip().splitlines()
    start = next((i for i, line in enumerate(text) if "ncalls" in line), 0)
    print("\n".join(text[start:]), flush=True)
    return text[start:]


# --- part 3: the node index ---------------------------------------------------------------------------


def part_index(opts: argparse.Namespace) -> Section:
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
        h_plain = per_call(functools.partial(review.handle, plain_body, "mutate-pods", view, CONFIG), repeat, target)
        h_sel = per_call(functools.partial(review.handle, pinned_body, "mutate-pods", view, CONFIG), repeat, target)
        lookups[n] = (t_plain, t_sel)
        rows.append((f"{n:,}", fmt(build * 1e3, 2), f"{kept / 1024:,.0f}", f"{kept / n:,.0f}", fmt(t_plain * 1e6, 2),
                     fmt(t_sel * 1e6, 1), fmt(t_aff * 1e6, 1), fmt(h_plain * 1e6, 1), fmt(h_sel * 1e6, 1)))
        print(f"[index] {n:>6} nodes: build {build * 1e3:8.2f} ms  kept {kept / 1024:8,.0f} KiB  "
              f"candidates {t_plain * 1e6:6.2f} / {t_sel * 1e6:9.1f} / {t_aff * 1e6:9.1f} µs  "
              f"handle {h_plain * 1e6:7.1f} / {h_sel * 1e6:9.1f} µs", flush=True)
    sec.lines += [
        "Nodes: two thirds S5000, one third S4000, 11 labels each, as Node JSON. *build*: "
        "`ClusterView.from_nodes` from Node dicts, best of 3. *kept*: what the view keeps alive "
        "(tracemalloc, Node dicts parsed fresh inside the trace and dropped after the build, so the label "
        "strings the view holds count). Lookups: `ClusterView.candidates` for an exclusive pod with no "
        "placement constraint (answered from the per-shape summary), with `nodeSelector` "
        "`mthreads.com/gpu.product: MTT-S5000`, and with the same requirement as a required nodeAffinity term; "
        "then the whole `review.handle` for the exclusive review without and with the nodeSelector. "
        "*kept* is the view alone, inside this benchmark's process: what a running replica holds in all is the "
        "scale part's peak RSS of the whole `serve` process.",
        "",
        *table(["nodes", "build ms", "kept KiB", "bytes/node", "candidates: none µs", "nodeSelector µs",
                "nodeAffinity µs", "handle: none µs", "handle: nodeSelector µs"], rows),
    ]
    if len(lookups) >= 2:
        lo, hi = min(lookups), max(lookups)
        sec.reading.append(
            "The node view alone (in process): a pod without placement constraints is looked up in "
            f"{lookups[hi][0] * 1e6:.2f} µs at "
            f"{hi:,} nodes ({lookups[lo][0] * 1e6:.2f} µs at {lo:,}), so it does not grow with the cluster; a "
            f"nodeSelector scans the nodes: {lookups[lo][1] * 1e6:,.0f} µs at {lo:,}, "
            f"{lookups[hi][1] * 1e6:,.0f} µs at {hi:,}.")
    return sec


# --- part 4: through the real API server ----------------------------------------------------------------


@dataclass
class Histogram:
    """One Prometheus histogram (cumulative buckets), summed over the label sets that were merged in."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, other: Histogram) -> Histogram:
        return Histogram({le: c - other.buckets.get(le, 0.0) for le, c in self.buckets.items()},
                         self.sum - other.sum, self.count - other.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """histogram_quantile(): linear interpolation inside the bucket that holds the rank."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            count = self.buckets[le]
            if count >= rank:
                if math.isinf(le):
                    return lower
                if count == below:
                    return le
                return lower + (le - lower) * (rank - below) / (count - below)
            lower, below = le, count
        return lower

    def share_within(self, bound: float) -> float:
        return self.buckets.get(bound, math.nan) / self.count if self.count else math.nan


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def histograms(text: str, metric: str, key: Sequence[str], where: dict[str, str] | None = None
               ) -> dict[tuple[str, ...], Histogram]:
    """Histograms of `metric` from Prometheus text, grouped by the `key` labels, filtered by `where`."""
    out: dict[tuple[str, ...], Histogram] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith(metric):
            continue
        suffix = m.group(1)[len(metric):]
        if suffix not in ("_bucket", "_sum", "_count"):
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if where and any(labels.get(k) != v for k, v in where.items()):
            continue
        h = out.setdefault(tuple(labels.get(k, "") for k in key), Histogram())
        value = float(m.group(3))
        if suffix == "_bucket":
            le = float(labels["le"])
            h.buckets[le] = h.buckets.get(le, 0.0) + value
        elif suffix == "_sum":
            h.sum += value
        else:
            h.count += value
    return out


def part_apiserver(opts: argparse.Namespace, workdir: Path) -> Section:
    from devtools.controlplane import ControlPlane
    from devtools.local import LocalWebhook

    sec = Section("4. Through a real kube-apiserver")
    nodes = cluster(opts.s5000, opts.s4000)
    print("[apiserver] starting etcd and kube-apiserver ...", flush=True)
    with ControlPlane(workdir=workdir) as cp:
        version = cp.kubectl("version", "-o", "json", check=False).stdout
        server_version = (orjson.loads(version).get("serverVersion", {}).get("gitVersion", "?")
                          if version.strip().startswith("{") else "?")
        hook = LocalWebhook(cp, cp.workdir / "webhook")
        hook.install()
        started = time.perf_counter()
        asyncio.run(_create_nodes(cp, nodes))
        print(f"[apiserver] {len(nodes)} nodes created in {time.perf_counter() - started:.1f} s", flush=True)
        hook.start()
        try:
            result = asyncio.run(_drive_pods(cp, hook, opts))
        finally:
            hook.stop()
    mutate, validate, own, client, statuses, bounds = (result.mutate, result.validate, result.own, result.client,
                                                       result.statuses, result.bounds)
    rows = []
    for label, h in (("mutating (" + mutate[0] + ")", mutate[1]), ("validating (" + validate[0] + ")", validate[1])):
        rows.append((f"API server: {label}", f"{h.count:,.0f}", fmt(h.quantile(0.5) * 1e3), fmt(h.quantile(0.99) * 1e3),
                     fmt(h.mean * 1e3), f"{h.share_within(bounds[0]):.1%}" if bounds else "–"))
    for name, h in own.items():
        rows.append((f"webhook's own histogram: /{name}", f"{h.count:,.0f}", fmt(h.quantile(0.5) * 1e3, 3),
                     fmt(h.quantile(0.99) * 1e3, 3), fmt(h.mean * 1e3, 3), ""))
    rows.append(("client: pod create round trip", f"{len(client):,}", fmt(percentile(client, 50)),
                 fmt(percentile(client, 99)), fmt(sum(client) / len(client) if client else math.nan), ""))
    first = f"≤ {bounds[0] * 1e3:g} ms" if bounds else "first bucket"
    sec.lines += [
        f"kube-apiserver {server_version} and etcd (local control plane), `hami-mt-webhook serve` as its own "
        f"process registered through the manifests' local overlay, {len(nodes)} nodes "
        f"({opts.s5000} S5000 + {opts.s4000} S4000). {opts.pods} pods of the part-1 mix created by POST "
        f"/api/v1/namespaces/<fresh>/pods at {opts.rate:g}/s (open loop, admin client certificate); "
        "histograms are the difference of /metrics before and after (after 10 warm-up pods), merged over "
        "`rejected` and `operation`.",
        "",
        *table(["what", "reviews", "p50 ms", "p99 ms", "mean ms", f"share {first}"], rows),
        "",
        "API server bucket bounds (s): " + ", ".join(f"{b:g}" for b in bounds) + ". Its buckets are coarse, so "
        "p50 and p99 are linear guesses inside a bucket (`histogram_quantile`); the mean (sum/count) is exact. "
        "The webhook's own histogram (`hami_mt_webhook_review_duration_seconds`) times the body read to "
        "the response built; the difference to the API server's mean is the HTTP, TLS and JSON round trip.",
        "",
        "Pod creations answered: " + ", ".join(f"HTTP {k}: {v}" for k, v in sorted(statuses.items()))
        + " (the denied kind is expected to get 403).",
    ]
    h = mutate[1]
    sec.reading.append(
        f"Through kube-apiserver at {opts.rate:g} pods/s the mutating webhook adds {h.mean * 1e3:.2f} ms on average "
        f"(p50 ≈ {h.quantile(0.5) * 1e3:.2f} ms, p99 ≈ {h.quantile(0.99) * 1e3:.2f} ms from coarse buckets), "
        f"the validating one {validate[1].mean * 1e3:.2f} ms; a pod create takes {percentile(client, 50):.1f} ms "
        "(p50) end to end.")
    return sec


def _api_ssl(cp: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.load_cert_chain(str(cp.workdir / "admin.crt"), str(cp.workdir / "admin.key"))
    return ctx


async def _create_nodes(cp: Any, nodes: list[dict[str, Any]]) -> None:
    """Create the Nodes and set their capacity through the status subresource, as kubelet would."""
    import aiohttp

    gate = asyncio.Semaphore(16)
    async with aiohttp.ClientSession(base_url=cp.server, connector=aiohttp.TCPConnector(ssl=_api_ssl(cp))) as s:
        async def one(n: dict[str, Any]) -> None:
            meta = {"name": n["metadata"]["name"], "labels": n["metadata"]["labels"]}
            capacity = n["status"]["capacity"]
            async with gate:
                async with s.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": meta}) as r:
                    if r.status not in (201, 409):
                        raise RuntimeError(f"creating node {meta['name']}: HTTP {r.status} {await r.text()}")
                async with s.patch(f"/api/v1/nodes/{meta['name']}/status",
                                   data=orjson.dumps({"status": {"capacity": capacity, "allocatable": capacity}}),
                                   headers={"Content-Type": "application/merge-patch+json"}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"patching node {meta['name']}: HTTP {r.status} {await r.text()}")

        await asyncio.gather(*(one(n) for n in nodes))


@dataclass
class ApiResult:
    mutate: tuple[str, Histogram]  # webhook name, histogram of the run
    validate: tuple[str, Histogram]
    own: dict[str, Histogram]  # the webhook's own review-duration histogram, by handler
    client: list[float]  # sorted pod-create round trips, ms
    statuses: dict[int, int]
    bounds: list[float]  # the API server's finite bucket bounds, s


async def _drive_pods(cp: Any, hook: Any, opts: argparse.Namespace) -> ApiResult:
    import aiohttp

    ns = f"bench-{secrets.token_hex(4)}"
    client: list[float] = []
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession(base_url=cp.server, connector=aiohttp.TCPConnector(ssl=_api_ssl(cp))) as s:
        async with s.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}}) as r:
            if r.status != 201:
                raise RuntimeError(f"creating namespace {ns}: HTTP {r.status} {await r.text()}")

        async def create(i: int, record: bool) -> None:
            kind = KINDS[i % len(KINDS)]
            body = orjson.dumps(pod(kind, f"{kind}-{i:05d}", ns))
            started = time.perf_counter()
            async with s.post(f"/api/v1/namespaces/{ns}/pods", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
                took = time.perf_counter() - started
                expected = 403 if EXPECT[kind] == "denied" else 201
                if r.status != expected:
                    raise RuntimeError(f"pod {kind}-{i}: HTTP {r.status}, expected {expected}: {await r.text()}")
            if record:
                client.append(took * 1e3)
                statuses[r.status] = statuses.get(r.status, 0) + 1

        async def metrics_text() -> str:
            async with s.get("/metrics") as r:
                return await r.text()

        await asyncio.gather(*(create(i, False) for i in range(10)))  # warm-up: connections to the webhook
        before, own_before = await metrics_text(), hook.metrics()
        t0 = time.perf_counter()
        tasks = []
        for i in range(opts.pods):  # open loop: each pod at its time, whether or not the last one finished
            delay = t0 + i / opts.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(create(10 + i, True)))
        await asyncio.gather(*tasks)
        print(f"[apiserver] {opts.pods} pods in {time.perf_counter() - t0:.1f} s", flush=True)
        after, own_after = await metrics_text(), hook.metrics()

    metric = "apiserver_admission_webhook_admission_duration_seconds"
    a = histograms(after, metric, ["name", "type"], {"operation": "CREATE"})
    b = histograms(before, metric, ["name", "type"], {"operation": "CREATE"})
    ours = {k: h.minus(b.get(k, Histogram())) for k, h in a.items() if "hami-mt" in k[0]}
    mutate = next(((k[0], h) for k, h in ours.items() if k[1] == "admit"), ("none", Histogram()))
    validate = next(((k[0], h) for k, h in ours.items() if k[1] == "validating"), ("none", Histogram()))
    bounds = sorted(le for le in mutate[1].buckets if not math.isinf(le))
    own_metric = "hami_mt_webhook_review_duration_seconds"
    oa, ob = histograms(own_after, own_metric, ["webhook"]), histograms(own_before, own_metric, ["webhook"])
    own = {k[0]: h.minus(ob.get(k, Histogram())) for k, h in sorted(oa.items())}
    return ApiResult(mutate, validate, own, sorted(client), statuses, bounds)


# --- part 5: hostile clients ----------------------------------------------------------------------------

#: The attacks of the hostile part: name, what the floods do, and the floods (kind, connections).
ATTACKS = (
    ("idle + slow-read", "600 TLS connections that send nothing, 100 that send a review and never read the answer",
     (("idle", 600), ("slow-read", 100))),
    ("unfinished handshakes", "2,000 TCP connections: half silent, half stopping after half a ClientHello",
     (("silent", 1000), ("half-hello", 1000))),
    ("large reviews", "40 clients posting 2.5 MiB AdmissionReviews in a loop", (("big", 40),)),
)


class Flooder:
    """One `hostile` flood in its own process, pinned beside the load generator."""

    def __init__(self, kind: str, count: int, port: int, cafile: Path, pin: list[str], log: Path) -> None:
        from devtools.controlplane import _die_with_parent

        cmd = [*pin, sys.executable, "-m", "devtools.hostile", kind, "--port", str(port),
               "--count", str(count), "--cafile", str(cafile)]
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=REPO_ROOT, preexec_fn=_die_with_parent())

    def wait_holding(self, timeout: float) -> bool:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            return bool(sel.select(timeout)) and self.proc.stdout.readline().strip() == b"holding"

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        with contextlib.suppress(ValueError, IndexError):
            return orjson.loads(out.strip().splitlines()[-1])
        return {}


def rss_mib(pid: int, field_name: str = "VmRSS") -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    return None


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
    floods: list[dict[str, Any]] = field(default_factory=list)
    held: bool = True


async def _during(port: int, health_port: int, cafile: Path, body: bytes, reviews: int,
                  spacing: float) -> tuple[list[tuple[int, dict, float]], list[tuple[int, float]]]:
    """`reviews` fresh reviews `spacing` s apart, and a /readyz probe every 0.25 s meanwhile."""
    from devtools import hostile

    answers: list[tuple[int, dict, float]] = []
    probes: list[tuple[int, float]] = []
    done = asyncio.Event()

    async def probing() -> None:
        while not done.is_set():
            probes.append(await hostile.probe(health_port))
            await asyncio.sleep(0.25)

    prober = asyncio.create_task(probing())
    for _ in range(reviews):
        answers.append(await hostile.fresh_review(port, str(cafile), body))
        await asyncio.sleep(spacing)
    done.set()
    await prober
    return answers, probes


def _hold_attack(name: str, what: str, floods: Sequence[tuple[str, int]], layout: certs.Layout, workdir: Path,
                 pin: Pinning, opts: argparse.Namespace) -> Held:
    result = Held(name, what)
    srv = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, "warning", health=True)
    flooders: list[Flooder] = []
    peak = [0.0]
    sampling = True

    def sample() -> None:
        while sampling:
            peak[0] = max(peak[0], rss_mib(srv.proc.pid) or 0.0)
            time.sleep(0.1)

    import threading

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        result.rss_before = rss_mib(srv.proc.pid)
        sampler.start()
        for i, (kind, count) in enumerate(floods):
            flooders.append(Flooder(kind, count, srv.port, layout.ca_cert, pin.load, workdir / f"flood-{i}.log"))
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
        srv.stop()
    return result


def _odd_requests(layout: certs.Layout, workdir: Path, pin: Pinning, opts: argparse.Namespace) -> list[list[str]]:
    """Attacks 4-6 and the idle deadline, each one request against a fresh server."""
    from devtools import hostile

    srv = Server("webhook", layout, workdir, pin.server, opts.s5000, opts.s4000, "warning")
    ca = str(layout.ca_cert)
    rows: list[list[str]] = []
    try:
        def with_value(value: str) -> bytes:
            resources = (obj := pod("slice"))["spec"]["containers"][0]["resources"]
            resources["limits"][MEMORY] = value
            resources["requests"].pop(MEMORY)
            return review_body(obj)

        async def go() -> None:
            gz = hostile.post(PATH, review_body(pod("slice")), close=True, extra="Content-Encoding: gzip\r\n")
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port, ssl=hostile.client_context(ca))
            writer.write(gz)
            try:
                status, headers, _ = await asyncio.wait_for(hostile.read_answer(reader), 10)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                status, headers = 0, {}
            writer.transport.abort()
            rows.append(["`Content-Encoding: gzip`, plain body", f"HTTP {status}",
                         f"`Server: {headers.get('server', '(none)')}`"])
            status, answer, _ = await hostile.fresh_review(srv.port, ca, with_value("9" * 2_000_000), timeout=30)
            size = len(orjson.dumps(answer))
            message = answer.get("response", {}).get("status", {}).get("message", "")
            rows.append(["a 2 MB quantity string", f"HTTP {status}, answer {size:,} bytes",
                         f"denial message {len(message)} characters"])
            for value in ("１", "1_6"):
                status, answer, _ = await hostile.fresh_review(srv.port, ca, with_value(value))
                allowed = answer.get("response", {}).get("allowed")
                rows.append([f"quantity `{value!r}`", f"HTTP {status}",
                             "allowed" if allowed else "denied" if allowed is False else "no answer"])
            idle, kept = await asyncio.gather(
                hostile.time_to_close(srv.port, ca),
                hostile.time_to_close(srv.port, ca, hostile.post(PATH, review_body(pod("slice")))))
            rows.append(["a connection that sends nothing", "closed after " + (f"{idle:.1f} s" if idle else "> 120 s"),
                         ""])
            rows.append(["a kept-alive connection after one review",
                         "closed after " + (f"{kept:.1f} s" if kept else "> 120 s"), ""])

        asyncio.run(go())
    finally:
        srv.stop()
    return rows


def part_hostile(opts: argparse.Namespace, workdir: Path) -> Section:
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
                     f"{fmt(worst_probe * 1e3, 0)} ms" + (f" ({failed_probes} failed)" if failed_probes else "")
                     if worst_probe is not None else "-",
                     f"{fmt(held.rss_before, 0)} → {fmt(held.rss_peak, 0)}",
                     "; ".join(f"{f.get('kind')}: {f.get('opened', 0):,} opened" for f in held.floods)
                     + ("" if held.held else " (the flood never reached its size)")])
    sec.lines += [
        "Each attack runs against a fresh webhook server (pinned like part 1) from a separate process "
        "(`python -m devtools.hostile`), which reopens every connection the server closes. Once the "
        f"flood is up, {opts.hostile_reviews} fresh reviews are sent 0.5 s apart, each on a new connection as "
        "kube-apiserver does after its pooled connections were cut, and `/readyz` is probed every 0.25 s. "
        "A review counts as answered correctly when it comes back HTTP 200 with the expected patch.",
        "",
        *table(["attack", "what the clients do", "fresh reviews answered", "max latency (ms)", "/readyz worst",
                "RSS MiB (before → peak)", "flood"], rows),
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
            + f", peak RSS {fmt(held.rss_peak, 0)} MiB.")
    return sec


# --- the report ---------------------------------------------------------------------------------------


def machine(load_start: str) -> list[str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, IndexError, ValueError):
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kib / 1024 / 1024:.1f} GiB memory"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"- CPU: {model}; nproc {usable} (of {os.cpu_count()} online){mem}",
            f"- Kernel: {platform.system()} {platform.release()}; load average (1, 5, 15 min) at the start: "
            f"{load_start}"]


def versions() -> list[str]:
    def v(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or commit
    wrk = "not installed"
    if shutil.which("wrk"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=5)
            wrk = (out.stdout + out.stderr).splitlines()[0].split(" Copyright")[0]
    return [f"- hami-mt-webhook {v('hami-mt-webhook')} at {commit}; Python {platform.python_version()} "
            f"({platform.python_implementation()}), {ssl.OPENSSL_VERSION}",
            f"- aiohttp {v('aiohttp')}, kopf {v('kopf')}, orjson {v('orjson')}, uvloop {v('uvloop')}, "
            f"prometheus-client {v('prometheus-client')}; load generator: {wrk}"]


def document(argv: Sequence[str], sections: list[Section], opts: argparse.Namespace, started: dt.datetime,
             load_start: str, load_end: str) -> str:
    command = shlex.join(["python", "-m", "devtools.bench", *argv])
    reading = [f"- {line}" for s in sections for line in s.reading]
    quick = ["", "**Quick run** (`--quick`, 2 s per point): a check that the harness works, not figures to quote."] \
        if opts.quick else []
    return "\n".join([
        "# Performance",
        "",
        "Written by `hami_mt_webhook/bench.py`; regenerate with `make bench BENCH_ARGS=\"--write "
        "docs/PERFORMANCE.md\"` on a quiet machine. The figures below come from one run of:",
        "",
        "```sh",
        command,
        "```",
        *quick,
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC.",
        "",
        *machine(load_start),
        f"- Load average at the end: {load_end}",
        *versions(),
        "",
        "## Reading",
        "",
        *(reading or ["- (no part ran)"]),
        "- Python serves one event loop per process: the webhook scales with replicas, not threads. "
        "The machine's other work shows in every figure; compare webhook and baseline from the same run only.",
        "",
        *[s.markdown() for s in sections],
    ])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

    p = argparse.ArgumentParser(prog="python -m devtools.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated subset of {', '.join(PARTS)} (or 1-6) [all]")
    p.add_argument("--skip-apiserver", action="store_true", help="leave out part 4 (no control plane needed)")
    p.add_argument("--quick", action="store_true", help="2 s per load point, fewer repeats, 60 pods: a smoke run")
    p.add_argument("--duration", type=float, default=None, help="seconds per load point [10; --quick: 2]")
    p.add_argument("--connections", type=ints, default=[1, 16, 64], help="load points [1,16,64]")
    p.add_argument("--load-generator", choices=["auto", "wrk", "python"], default="auto",
                   help="auto: wrk when installed, else the built-in asyncio client [auto]")
    p.add_argument("--s5000", type=int, default=200, help="S5000 nodes (8 cards of 160) in parts 1, 2, 4 [200]")
    p.add_argument("--s4000", type=int, default=100, help="S4000 nodes (1 card of 96) in parts 1, 2, 4 [100]")
    p.add_argument("--log-level", default="info", help="the webhook server's log level in part 1 [info, as shipped]")
    p.add_argument("--index-sizes", type=ints, default=[100, 1000, 10000], help="part 3 node counts [100,1000,10000]")
    p.add_argument("--pods", type=int, default=None, help="pods created in part 4 [200; --quick: 60]")
    p.add_argument("--rate", type=float, default=20.0, help="pods per second in part 4 [20]")
    p.add_argument("--scale-sizes", type=ints, default=[1000, 5000, 10000],
                   help="part scale: node counts, each started from scratch [1000,5000,10000]")
    p.add_argument("--scale-seconds", type=float, default=20.0, help="part scale: seconds of idle pods [20]")
    p.add_argument("--scale-churn", type=float, default=100.0, help="part scale: node status updates/s [100]")
    p.add_argument("--churn-seconds", type=float, default=60.0,
                   help="part scale: seconds of churn (600 for the 10-minute memory figure) [60]")
    p.add_argument("--hostile-reviews", type=int, default=20, help="fresh reviews per attack in part 5 [20]")
    p.add_argument("--hops-rounds", type=int, default=4, help="part hops: rounds, --pods split over them [4]")
    p.add_argument("--profile", action="store_true",
                   help="add cProfiles: of review.handle over the mix (part 2) and of the server under load (part 1)")
    p.add_argument("--write", type=Path, metavar="FILE", help="also write the report as Markdown (docs/PERFORMANCE.md)")
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
        return internal(argv)
    opts = parse_args(argv)
    started, load_start = dt.datetime.now(dt.UTC), loadavg()
    print(f"hami-mt-webhook benchmark: parts {', '.join(opts.parts)}; load average {load_start}", flush=True)
    sections: list[Section] = []
    with tempfile.TemporaryDirectory(prefix="hami-mt-bench-") as tmp:
        workdir = Path(tmp)
        for part in opts.parts:
            if part == "http":
                sec = part_http(opts, workdir)
            elif part == "inprocess":
                sec = part_inprocess(opts)
            elif part == "index":
                sec = part_index(opts)
            elif part == "hostile":
                sec = part_hostile(opts, workdir)
            elif part == "scale":
                from devtools.bench.scale import part_scale
                sec = part_scale(opts, workdir / "scale")
            elif part == "hops":
                from devtools.bench.hops import part_hops
                sec = part_hops(opts, workdir / "hops")
            else:
                sec = part_apiserver(opts, workdir / "controlplane")
            sections.append(sec)
            print("\n" + sec.markdown(), flush=True)
    text = document(argv, sections, opts, started, load_start, loadavg())
    if opts.write:
        opts.write.parent.mkdir(parents=True, exist_ok=True)
        kept = ""
        if opts.write.exists():  # the hand-written analysis below the marker survives a rerun
            old = opts.write.read_text()
            if NOTES_MARKER in old:
                kept = "\n" + old[old.index(NOTES_MARKER):]
        opts.write.write_text(text + "\n" + kept)
        print(f"written to {opts.write}")
    else:
        print("## Reading\n\n" + "\n".join(f"- {line}" for s in sections for line in s.reading))
    return 0


if __name__ == "__main__":
    sys.exit(main())
