"""A real etcd + kube-apiserver on loopback, for end-to-end tests, `make run` and `controlplane up`.

The webhook's promises (patches, denials, failure policy, RBAC of its own user) only mean something
against the API server that calls it, so the tests run one: envtest-style, no kubelet. With
`controllers=True` kube-controller-manager and kube-scheduler join it (`devtools.clusters.controllers`), so
workloads create their pods and pods are bound to nodes; pods are still never run.

Only `certs` is used from the package, so the module can start a cluster for any part of it. The
binaries come from `devtools.builds.binaries`, the certificates from `devtools.pki`.

`python -m devtools.clusters.controlplane up|down` (the end of this module) runs one from a shell and stops it
from another.

The node tier (`devtools.clusters.nodes`) runs the same processes inside a network namespace of its own (its
fabric), with kubelets in namespaces routed to it: `command_prefix` enters it, `reach` gives the loopback
port here that leads to a port there, and `node_ip` turns on what real nodes need (Node authorization,
the kubelet's client certificate, every controller, a default scheduler).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from devtools import pki
from devtools.builds.binaries import ControlPlaneError, binaries
from devtools.clusters import controllers

# Ports, child processes and cleanup: devtools.procs, shared with `make run` and the benchmark.
from devtools.paths import RUN_DIR
from devtools.procs import STOP_GRACE_S
from devtools.procs import cleanup as _cleanup
from devtools.procs import free_ports as _free_ports
from devtools.procs import spawn as _spawn
from devtools.procs import tail as _tail
from devtools.waiting import NotWithin, until
from hami_mt_webhook.service import certs

__all__ = ["ControlPlane", "ControlPlaneError", "KubectlError", "binaries"]


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message includes what kubectl said, not only its exit status."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '').strip()}"


# --- the control plane --------------------------------------------------------------------------------


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, with an admin kubeconfig and a private CA;
    with `controllers`, kube-controller-manager and kube-scheduler too (`devtools.clusters.controllers`).

    Single use: `start()` once (or enter the context), `stop()` once. Everything lives in the `workdir`
    property: a fresh directory made inside the `workdir` argument (default: the system temp dir), so
    several control planes can share a parent; it is removed on stop unless `keep`.
    `apiserver_args` are appended to the kube-apiserver flags (feature gates, audit, ...).

    For real nodes (`devtools.clusters.nodes`): `command_prefix` is put before every command started (entering a
    namespace), `reach(port)` is the loopback port here that leads to `port` where they listen,
    `apiserver_port` fixes the API server's port, and `node_ip` is its address for kubelets and pods: the API
    server listens on every address of its namespace, advertises `node_ip`, authorizes kubelets (Node,
    NodeRestriction) and reaches them with a client certificate; every controller runs, and kube-scheduler
    answers to `default-scheduler` too.

    `extender` (with `controllers`) starts a scheduler extender before kube-scheduler, given the started
    control plane, and returns the URL kube-scheduler is to call it at: HAMi's own, in the `hami` tier
    (`devtools.clusters.hami.SchedulerExtender`). `default_scheduler` (with `controllers`) has kube-scheduler answer
    to `default-scheduler` without a real node, so pods that name no scheduler (the chart's own) are bound.
    """

    def __init__(self, *, bin_dir: Path | None = None, workdir: Path | None = None, keep: bool = False,
                 ready_timeout: float = 90.0, apiserver_args: Sequence[str] = (),
                 controllers: bool = False, command_prefix: Sequence[str] = (),
                 reach: Callable[[int], int] | None = None, apiserver_port: int | None = None,
                 node_ip: str | None = None, extender: Callable[[ControlPlane], str] | None = None,
                 default_scheduler: bool = False) -> None:
        self.extender = extender
        self.default_scheduler = default_scheduler
        self.command_prefix = list(command_prefix)
        self._reach = reach or (lambda port: port)
        self._fixed_apiserver_port = apiserver_port
        self.node_ip = node_ip
        #: The loopback port here that leads to the API server (its own port unless `reach` says otherwise).
        self.local_apiserver_port = 0
        self._bin_dir = bin_dir
        self._parent_dir = workdir
        self.keep = keep
        self.ready_timeout = ready_timeout
        self.apiserver_args = list(apiserver_args)
        self.controllers = controllers
        self._workdir: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._finalizer: weakref.finalize | None = None
        self._ca: certs.KeyPair | None = None
        self.etcd_client_port = self.etcd_peer_port = self.apiserver_port = 0
        #: Seconds from `start()` to a ready API server; what a test session pays per control plane.
        self.startup_seconds: float | None = None
        #: What the API server says it is (`/version`'s gitVersion, "v1.30.14"), known once started.
        self.git_version = ""
        self._api = threading.local()  # each thread's kept-alive connection (`get`)

    # properties ---------------------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the control plane has not been started")
        return self._workdir

    @property
    def server(self) -> str:
        """The API server's URL from this process (the admin kubeconfig's, kubectl's, the tests')."""
        return f"https://127.0.0.1:{self.local_apiserver_port or self.apiserver_port}"

    @property
    def inner_server(self) -> str:
        """The API server's URL where it runs: for the components started beside it."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig."""
        return self.workdir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "ca.crt"

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the client certificate the API server shows webhooks: a webhook's `--client-ca`."""
        return self.ca_file

    @property
    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = binaries()
        return self._bin_dir

    @property
    def minor(self) -> int:
        """The API server's Kubernetes minor (30 for v1.30.14): what version-dependent behaviour keys on."""
        if not self.git_version:
            raise ControlPlaneError("the control plane has not been started")
        return int(self.git_version.split(".")[1])

    @property
    def pids(self) -> dict[str, int]:
        """Pids of the running children, by binary name."""
        return {self._name(p): p.pid for p in self._procs if p.poll() is None}

    def exited(self) -> list[str]:
        """The started processes that are no longer running: a supervisor's signal to give up."""
        return [self._name(p) for p in self._procs if p.poll() is not None]

    def _name(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(str(list(proc.args)[len(self.command_prefix)])).name  # type: ignore[arg-type]

    def spawn(self, cmd: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `cmd` where the control plane runs (after `command_prefix`), stopped with it; `env` is
        added to this process's environment."""
        proc = _spawn([*self.command_prefix, *cmd], log, env={**os.environ, **env} if env else None)
        self._procs.append(proc)
        return proc

    # lifecycle ----------------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd, then kube-apiserver (then the controllers), and wait until each is ready.

        On any failure everything started so far is stopped before the error propagates.
        """
        if self._finalizer is not None:
            raise ControlPlaneError("a ControlPlane starts once; make a new one")
        bin_dir = self.bin_dir  # may build for many minutes: before the clock starts
        started = time.monotonic()
        if self._parent_dir is not None:
            self._parent_dir.mkdir(parents=True, exist_ok=True)
        self._workdir = Path(tempfile.mkdtemp(prefix="hami-mt-controlplane-", dir=self._parent_dir))
        self._finalizer = weakref.finalize(self, _cleanup, self._procs, None if self.keep else self._workdir)
        try:
            self._ca = pki.write_pki(self.workdir)
            self.etcd_client_port, self.etcd_peer_port, self.apiserver_port = _free_ports(3)
            if self._fixed_apiserver_port:
                self.apiserver_port = self._fixed_apiserver_port
            self._start_etcd(bin_dir)
            self._start_apiserver(bin_dir)
            pki.write_kubeconfig(self.kubeconfig, self.server, self.ca_pem, "admin",
                                 self.workdir / "admin.crt", self.workdir / "admin.key")
            if self.controllers:
                self._start_controllers(bin_dir)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop the processes newest first, etcd last; remove the work dir unless `keep`. Safe to call
        twice."""
        if self._finalizer is not None:
            self._finalizer()

    # identities -------------------------------------------------------------------------------------

    def user_kubeconfig(self, name: str, groups: Iterable[str] = ()) -> Path:
        """A kubeconfig for user `name` in `groups`, with no rights until RBAC grants some.

        This is how the webhook runs as the project's own ServiceAccount-like identity: bound only to
        its ClusterRole, so a missing permission shows up in the tests and not in production.
        """
        if self._ca is None:
            raise ControlPlaneError("the control plane has not been started")
        return pki.user_kubeconfig(self.workdir, self._ca, self.server, name, groups)

    # processes ----------------------------------------------------------------------------------------

    def _start_etcd(self, bin_dir: Path) -> None:
        client = f"http://127.0.0.1:{self.etcd_client_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        log = self.workdir / "etcd.log"
        proc = self.spawn([
            str(bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--initial-cluster-state=new",
            "--quota-backend-bytes=2147483648",
            "--unsafe-no-fsync",  # throwaway data: durability costs seconds per test run
        ], log)
        self._wait("etcd", proc, log, f"http://127.0.0.1:{self._reach(self.etcd_client_port)}/health",
                   lambda body: json.loads(body).get("health") == "true")

    def _apiserver_cmd(self, bin_dir: Path) -> list[str]:
        if self.node_ip:
            return self._node_apiserver_cmd(bin_dir, self.node_ip)
        d = self.workdir
        return [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_client_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={d / 'apiserver.crt'}", f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--service-cluster-ip-range={pki.SERVICE_CIDR}",
            "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy",
            # ServiceAccount: without a controller-manager no `default` ServiceAccount exists, and with one a
            # pod created at once in a new namespace would race it. TaintNodesByCondition: its not-ready taint
            # is lifted only by the node lifecycle controller, which has no kubelets to hear from
            # (controllers).
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            f"--admission-control-config-file={d / 'admission.yaml'}",
            "--allow-privileged=true",
            # Nothing can reach the `kubernetes` Service's endpoints anyway, and a loopback endpoint
            # only fills the log with rejected updates.
            "--endpoint-reconciler-type=none",
            *self.apiserver_args,
        ]

    def _node_apiserver_cmd(self, bin_dir: Path, node_ip: str) -> list[str]:
        """The flags of a cluster with kubelets: the admission plugins' defaults (ServiceAccount gives pods
        their tokens) plus the webhooks and NodeRestriction, Node authorization, a client certificate for
        kubelets, Services called through their endpoints (there is no kube-proxy), and the `kubernetes`
        endpoints at `node_ip`, where pods reach it."""
        d = self.workdir
        return [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_client_port}",
            "--bind-address=0.0.0.0", f"--advertise-address={node_ip}",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={d / 'apiserver.crt'}", f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--service-cluster-ip-range={pki.SERVICE_CIDR}",
            "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy",
            f"--admission-control-config-file={d / 'admission.yaml'}",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={d / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={d / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={d / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--enable-aggregator-routing=true",
            *self.apiserver_args,
        ]

    def _start_apiserver(self, bin_dir: Path) -> None:
        log = self.workdir / "kube-apiserver.log"
        if self.node_ip:
            assert self._ca is not None
            pki.write_kubelet_client(self.workdir, self._ca)
        proc = self.spawn(self._apiserver_cmd(bin_dir), log)
        self.local_apiserver_port = self._reach(self.apiserver_port)
        self._wait("kube-apiserver", proc, log, f"{self.server}/readyz", lambda body: body.strip() == b"ok")
        # /readyz does not cover the system namespaces; tests create objects in `default` at once.
        self._wait("kube-apiserver", proc, log, f"{self.server}/api/v1/namespaces/default", lambda body: True)
        with self._opener().open(f"{self.server}/version", timeout=10) as answer:
            self.git_version = json.loads(answer.read())["gitVersion"]

    def restart_apiserver(self, down: float = 0.0) -> None:
        """Kill kube-apiserver as a crash would (SIGKILL), wait `down` seconds, start it again on its port."""
        for proc in [p for p in self._procs if self._name(p) == "kube-apiserver"]:
            proc.kill()
            proc.wait()
            self._procs.remove(proc)
        time.sleep(down)
        self._start_apiserver(self.bin_dir)

    def _start_controllers(self, bin_dir: Path) -> None:
        """kube-controller-manager and kube-scheduler, each as its bootstrap identity, healthy before we
        return."""
        assert self._ca is not None
        d = self.workdir
        everything = self.node_ip is not None
        for name in ("kube-controller-manager", "kube-scheduler"):
            kubeconfig = pki.user_kubeconfig(d, self._ca, self.inner_server, f"system:{name}")
            port = _free_ports(1)[0]
            log = d / f"{name}.log"
            if name == "kube-scheduler":
                extender = self.extender(self) if self.extender else None  # up before anything calls it
                cmd = controllers.scheduler_cmd(bin_dir, d, self._ca, kubeconfig, port,
                                                default=everything or self.default_scheduler,
                                                extender=extender)
            else:
                cmd = controllers.controller_manager_cmd(bin_dir, d, self._ca, kubeconfig, port, every=everything)
            proc = self.spawn(cmd, log)
            self._wait(name, proc, log, f"https://127.0.0.1:{self._reach(port)}/healthz",
                       lambda body: body.strip() == b"ok")

    def _admin_tls(self) -> ssl.SSLContext:
        """TLS that trusts our CA and presents the admin cert."""
        ctx = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
        ctx.load_cert_chain(str(self.workdir / "admin.crt"), str(self.workdir / "admin.key"))
        return ctx

    def _opener(self) -> urllib.request.OpenerDirector:
        """An HTTP(S) client that trusts our CA, presents the admin cert and ignores proxy settings."""
        return urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                           urllib.request.HTTPSHandler(context=self._admin_tls()))

    def wait_ready(self, what: str, proc: subprocess.Popen[bytes], log: Path, url: str) -> None:
        """Wait until `url` answers 2xx, as for the control plane's own processes: for a process started
        beside them (`spawn`)."""
        self._wait(what, proc, log, url, lambda body: True)

    def _wait(self, what: str, proc: subprocess.Popen[bytes], log: Path, url: str,
              ok: Callable[[bytes], bool]) -> None:
        """Poll `url` until `ok(body)`; fail early if the process exits, late after `ready_timeout`."""
        opener = self._opener()
        last = "no answer yet"

        def answers() -> bool:
            nonlocal last
            if proc.poll() is not None:
                raise ControlPlaneError(f"{what} exited with status {proc.returncode} while starting; "
                                        f"end of {log}:\n{_tail(log)}")
            try:
                with opener.open(url, timeout=5) as resp:
                    body = resp.read()
                if ok(body):
                    return True
                last = body.decode(errors="replace")[-2000:]
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read().decode(errors='replace')[-2000:]}"
            except (OSError, ValueError) as e:
                last = repr(e)
            return False

        until(f"{what} ready at {url}", answers, self.ready_timeout, 0.2,
              fail=lambda m: ControlPlaneError(f"{m}; last answer: {last}\nend of {log}:\n{_tail(log)}"))

    # reads ---------------------------------------------------------------------------------------------

    def get(self, path: str, timeout: float = 10.0, **query: str) -> Any:
        """GET `path` of the API as admin (`query` its parameters, `labelSelector=...`), the answer's JSON.
        For what a harness polls several times a second: a kubectl is a process and a TLS handshake each
        time, about a tenth of a second of a core; this keeps one connection per thread. Raises KubectlError
        on a status other than 200, OSError when the API server does not answer."""
        url = path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile is opened again, once
            conn = self._connection(timeout)
            try:
                conn.request("GET", url, headers={"Accept": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._api.conn = None
                if attempt == 2:
                    raise
                continue
            if resp.status != 200:
                raise KubectlError(1, ["GET", url], "", f"HTTP {resp.status}: {body.decode(errors='replace')}")
            return json.loads(body)

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._api, "conn", None)
        if conn is None or getattr(self._api, "server", "") != self.server:
            host = urllib.parse.urlsplit(self.server)
            conn = http.client.HTTPSConnection(host.hostname or "127.0.0.1", host.port, context=self._admin_tls())
            self._api.conn, self._api.server = conn, self.server
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    # kubectl ------------------------------------------------------------------------------------------

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (as admin unless `kubeconfig` says otherwise) and capture its output."""
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result


# --- `python -m devtools.clusters.controlplane up|down` ------------------------------------------------------------
# `up` writes a state file (pids with their start times, ports, paths) into `--dir`; `down` reads it,
# asks `up` to stop its children in order, and kills whatever a SIGKILLed `up` left behind.

DEFAULT_RUN_DIR = RUN_DIR
STATE_FILE = "controlplane.json"
KUBECONFIG_FILE = "admin.kubeconfig"


def build_parser() -> argparse.ArgumentParser:
    """`python -m devtools.clusters.controlplane up|down`."""
    parser = argparse.ArgumentParser(prog="python -m devtools.clusters.controlplane",
                                     description="run a local etcd, kube-apiserver, kube-controller-manager "
                                                 "and kube-scheduler on loopback")
    actions = parser.add_subparsers(dest="controlplane_action", required=True)
    up = actions.add_parser("up", help="start, print the kubeconfig, and run until SIGINT/SIGTERM/SIGHUP")
    down = actions.add_parser("down", help=f"stop what `up` started (read from <dir>/{STATE_FILE})")
    for p in (up, down):
        p.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR,
                       help=f"where the state file and the work dir live (default: {DEFAULT_RUN_DIR})")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the API server")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.controlplane_action == "up":
        return _up(Path(args.dir).expanduser(), args.timeout)
    return _down(Path(args.dir).expanduser())


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks: tells a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]


def _same_process(entry: dict[str, Any]) -> bool:
    pid, start = entry.get("pid"), entry.get("start")
    return isinstance(pid, int) and start is not None and _proc_start(pid) == start


def _up(run_dir: Path, timeout: float) -> int:
    state_path, kubeconfig = run_dir / STATE_FILE, run_dir / KUBECONFIG_FILE
    if state_path.exists():
        state = json.loads(state_path.read_text())
        if _same_process(state.get("up", {})):
            print(f"a control plane is already running (pid {state['up']['pid']}); "
                  f"run `controlplane down --dir {run_dir}` first", file=sys.stderr)
            return 1
    stopping = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopping.set())
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}  # SIGHUP: the terminal closed
    cp = ControlPlane(workdir=run_dir, ready_timeout=timeout, controllers=True)
    try:
        try:
            cp.start()
        except ControlPlaneError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        entry = {name: {"pid": pid, "start": _proc_start(pid)} for name, pid in cp.pids.items()}
        state = {
            "up": {"pid": os.getpid(), "start": _proc_start(os.getpid())},
            **entry,
            "ports": {"etcd_client": cp.etcd_client_port, "etcd_peer": cp.etcd_peer_port,
                      "apiserver": cp.apiserver_port},
            "server": cp.server, "kubeconfig": str(kubeconfig), "workdir": str(cp.workdir),
        }
        # A path that stays the same across restarts, so one `export KUBECONFIG` keeps working.
        certs.write_atomic(kubeconfig, cp.kubeconfig.read_bytes(), 0o600)
        certs.write_atomic(state_path, json.dumps(state, indent=2).encode())
        print(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.server}", file=sys.stderr)
        print(kubeconfig)
        print(f"export KUBECONFIG={kubeconfig}", flush=True)
        while not stopping.wait(1.0):
            if exited := cp.exited():
                print(f"error: {', '.join(exited)} exited; see the logs in {cp.workdir}", file=sys.stderr)
                return 1
        return 0
    finally:
        cp.stop()
        state_path.unlink(missing_ok=True)
        kubeconfig.unlink(missing_ok=True)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _down(run_dir: Path) -> int:
    state_path = run_dir / STATE_FILE
    if not state_path.exists():
        print(f"nothing to stop: no {state_path}", file=sys.stderr)
        return 0
    state = json.loads(state_path.read_text())
    up = state.get("up", {})
    if _same_process(up):  # let `up` stop its children in order and clean up after itself
        os.kill(up["pid"], signal.SIGTERM)
        _wait_gone(up, 2 * STOP_GRACE_S + 5)
    # Whatever is left, e.g. after `up` was SIGKILLed; clients of the API server first, etcd last.
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        entry = state.get(name, {})
        if _same_process(entry):
            os.kill(entry["pid"], signal.SIGTERM)
            if not _wait_gone(entry, STOP_GRACE_S):
                os.kill(entry["pid"], signal.SIGKILL)
                _wait_gone(entry, 5)
    workdir = Path(state.get("workdir", ""))
    if workdir.is_relative_to(run_dir) and workdir != run_dir:  # never remove anything outside --dir
        shutil.rmtree(workdir, ignore_errors=True)
    (run_dir / KUBECONFIG_FILE).unlink(missing_ok=True)
    state_path.unlink(missing_ok=True)
    print("control plane stopped", file=sys.stderr)
    return 0


def _wait_gone(entry: dict[str, Any], timeout: float) -> bool:
    """Whether the process has exited within `timeout`: `down` then SIGKILLs one that has not."""
    try:
        until(f"pid {entry.get('pid')} gone", lambda: not _same_process(entry), timeout, 0.1)
    except NotWithin:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
