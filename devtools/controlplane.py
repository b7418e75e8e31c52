"""A real etcd + kube-apiserver on loopback, for end-to-end tests and `controlplane up`.

The webhook's promises (patches, denials, failure policy, RBAC of its own user) only mean something
against the API server that calls it, so the tests run one: envtest-style, no kubelet, no
controller-manager, no scheduler. Pods are stored but never run, which is all admission needs.

Only `certs` is used from this package, so the module can start a cluster for any part of it.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

# Ports, child processes and cleanup: devtools.procs, shared with `make run` and the benchmark.
from devtools.procs import cleanup as _cleanup
from devtools.procs import free_ports as _free_ports
from devtools.procs import spawn as _spawn
from devtools.procs import tail as _tail
from hami_mt_webhook.service import certs

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-controlplane.sh"
BIN_ENV = "HAMI_MT_CONTROLPLANE_BIN"
BINARIES = ("etcd", "kube-apiserver", "kubectl", "helm")
DEFAULT_RUN_DIR = Path.home() / ".cache" / "hami-mt-webhook" / "run"
STATE_FILE = "controlplane.json"
KUBECONFIG_FILE = "admin.kubeconfig"

SERVICE_CIDR = "10.0.0.0/24"
#: The first address of SERVICE_CIDR: the `kubernetes` Service's cluster IP, so in-cluster names verify.
SERVICE_IP = "10.0.0.1"
APISERVER_DNS = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"]
CLUSTER_NAME = "hami-mt-local"
#: How long one process gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message carries the relevant log tail."""


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message includes what kubectl said, not only its exit status."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '').strip()}"


# --- binaries -----------------------------------------------------------------------------------------


def binaries() -> Path:
    """The directory with etcd, kube-apiserver, kubectl and helm.

    `$HAMI_MT_CONTROLPLANE_BIN` wins, for machines that already have the binaries; otherwise the
    build script builds them once into a versioned cache (progress goes to our stderr, since a first
    build takes many minutes and silence would look like a hang).
    """
    env_dir = os.environ.get(BIN_ENV)
    if env_dir:
        return _check_binaries(Path(env_dir), f"${BIN_ENV}")
    proc = subprocess.Popen(["bash", str(BUILD_SCRIPT)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    for line in proc.stderr:  # stdout carries one line only, so reading it afterwards cannot block
        tail.append(line)
        sys.stderr.write(line)
        sys.stderr.flush()
    out = proc.stdout.read().strip()
    if proc.wait() != 0 or not out:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}:\n{''.join(tail)}")
    return _check_binaries(Path(out.splitlines()[-1]), str(BUILD_SCRIPT))


def _check_binaries(path: Path, source: str) -> Path:
    missing = [b for b in BINARIES if not os.access(path / b, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{source} names {path}, which lacks executable {', '.join(missing)}")
    return path


# --- the control plane --------------------------------------------------------------------------------


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, with an admin kubeconfig and a private CA.

    Single use: `start()` once (or enter the context), `stop()` once. Everything lives in the `workdir`
    property: a fresh directory made inside the `workdir` argument (default: the system temp dir), so
    several control planes can share a parent; it is removed on stop unless `keep`.
    `apiserver_args` are appended to the kube-apiserver flags (feature gates, audit, ...).
    """

    def __init__(self, *, bin_dir: Path | None = None, workdir: Path | None = None, keep: bool = False,
                 ready_timeout: float = 90.0, apiserver_args: Sequence[str] = ()) -> None:
        self._bin_dir = bin_dir
        self._parent_dir = workdir
        self.keep = keep
        self.ready_timeout = ready_timeout
        self.apiserver_args = list(apiserver_args)
        self._workdir: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._finalizer: weakref.finalize | None = None
        self._ca: certs.KeyPair | None = None
        self.etcd_client_port = self.etcd_peer_port = self.apiserver_port = 0
        #: Seconds from `start()` to a ready API server; what a test session pays per control plane.
        self.startup_seconds: float | None = None

    # properties ---------------------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the control plane has not been started")
        return self._workdir

    @property
    def server(self) -> str:
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
    def pids(self) -> dict[str, int]:
        """Pids of the running children, by binary name."""
        return {Path(str(p.args[0])).name: p.pid for p in self._procs if p.poll() is None}

    # lifecycle ----------------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd, then kube-apiserver, and wait until the API server is ready.

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
            self._write_pki()
            self.etcd_client_port, self.etcd_peer_port, self.apiserver_port = _free_ports(3)
            self._start_etcd(bin_dir)
            self._start_apiserver(bin_dir)
            self._write_kubeconfig(self.kubeconfig, "admin", self.workdir / "admin.crt", self.workdir / "admin.key")
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; remove the work dir unless `keep`. Safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()

    # pki ----------------------------------------------------------------------------------------------

    def _write_pki(self) -> None:
        d = self.workdir
        self._ca = ca = certs.new_ca("hami-mt-controlplane-ca")
        certs.write_pair(ca, d / "ca.crt", d / "ca.key")
        serving = certs.issue(ca, "kube-apiserver", dns=APISERVER_DNS, ips=["127.0.0.1", SERVICE_IP])
        certs.write_pair(serving, d / "apiserver.crt", d / "apiserver.key")
        admin = certs.issue(ca, "admin", orgs=["system:masters"], server=False, client=True)
        certs.write_pair(admin, d / "admin.crt", d / "admin.key")
        self._write_admission_config()
        sa = ec.generate_private_key(ec.SECP256R1())
        certs.write_atomic(d / "sa.key", sa.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()), 0o600)
        certs.write_atomic(d / "sa.pub", sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def _write_admission_config(self) -> None:
        """An AdmissionConfiguration giving the API server a client certificate for every webhook it calls.

        As on a real cluster where webhooks check the caller (`--client-ca`): the webhook plugins read a
        kubeconfig whose user `*` matches any webhook host, and present its certificate in the TLS handshake.
        """
        d = self.workdir
        assert self._ca is not None
        client = certs.issue(self._ca, "kube-apiserver-webhook-client", server=False, client=True)
        certs.write_pair(client, d / "webhook-client.crt", d / "webhook-client.key")
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": {
            "client-certificate": str(d / "webhook-client.crt"), "client-key": str(d / "webhook-client.key")}}]}
        certs.write_atomic(d / "admission.kubeconfig", yaml.safe_dump(kubeconfig).encode(), 0o600)
        plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
                  "kubeConfigFile": str(d / "admission.kubeconfig")}
        config = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
                  "plugins": [{"name": name, "configuration": plugin}
                              for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}
        certs.write_atomic(d / "admission.yaml", yaml.safe_dump(config, sort_keys=False).encode())

    def _write_kubeconfig(self, path: Path, user: str, cert: Path | bytes, key: Path | bytes) -> Path:
        """A self-contained kubeconfig (data embedded), so it can be copied or mounted on its own."""
        def b64(v: Path | bytes) -> str:
            return base64.b64encode(v.read_bytes() if isinstance(v, Path) else v).decode()

        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": CLUSTER_NAME, "cluster": {
                "server": self.server, "certificate-authority-data": b64(self.ca_pem)}}],
            "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
            "contexts": [{"name": user, "context": {"cluster": CLUSTER_NAME, "user": user}}],
            "current-context": user,
        }
        certs.write_atomic(path, yaml.safe_dump(config, sort_keys=False).encode(), 0o600)
        return path

    def user_kubeconfig(self, name: str, groups: Iterable[str] = ()) -> Path:
        """A kubeconfig for user `name` in `groups`, with no rights until RBAC grants some.

        This is how the webhook runs as the project's own ServiceAccount-like identity: bound only to
        its ClusterRole, so a missing permission shows up in the tests and not in production.
        """
        if self._ca is None:
            raise ControlPlaneError("the control plane has not been started")
        pair = certs.issue(self._ca, name, orgs=list(groups), server=False, client=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        return self._write_kubeconfig(self.workdir / f"user-{safe}.kubeconfig", name,
                                      pair.cert_pem(), pair.key_pem())

    # processes ----------------------------------------------------------------------------------------

    def _start_etcd(self, bin_dir: Path) -> None:
        client = f"http://127.0.0.1:{self.etcd_client_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        log = self.workdir / "etcd.log"
        proc = _spawn([
            str(bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--initial-cluster-state=new",
            "--quota-backend-bytes=2147483648",
            "--unsafe-no-fsync",  # throwaway data: durability costs seconds per test run
        ], log)
        self._procs.append(proc)
        self._wait("etcd", proc, log, f"{client}/health", lambda body: json.loads(body).get("health") == "true")

    def _apiserver_cmd(self, bin_dir: Path) -> list[str]:
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
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy",
            # No controller-manager creates the `default` ServiceAccount that this plugin requires.
            "--disable-admission-plugins=ServiceAccount",
            f"--admission-control-config-file={d / 'admission.yaml'}",
            "--allow-privileged=true",
            # Nothing can reach the `kubernetes` Service's endpoints anyway, and a loopback endpoint
            # only fills the log with rejected updates.
            "--endpoint-reconciler-type=none",
            *self.apiserver_args,
        ]

    def _start_apiserver(self, bin_dir: Path) -> None:
        log = self.workdir / "kube-apiserver.log"
        proc = _spawn(self._apiserver_cmd(bin_dir), log)
        self._procs.append(proc)
        self._wait("kube-apiserver", proc, log, f"{self.server}/readyz", lambda body: body.strip() == b"ok")
        # /readyz does not cover the system namespaces; tests create objects in `default` at once.
        self._wait("kube-apiserver", proc, log, f"{self.server}/api/v1/namespaces/default", lambda body: True)

    def restart_apiserver(self, down: float = 0.0) -> None:
        """Kill kube-apiserver as a crash would (SIGKILL), wait `down` seconds, start it again on its port."""
        for proc in [p for p in self._procs if Path(str(p.args[0])).name == "kube-apiserver"]:
            proc.kill()
            proc.wait()
            self._procs.remove(proc)
        time.sleep(down)
        self._start_apiserver(self.bin_dir)

    def _opener(self) -> urllib.request.OpenerDirector:
        """An HTTP(S) client that trusts our CA, presents the admin cert and ignores proxy settings."""
        ctx = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
        ctx.load_cert_chain(str(self.workdir / "admin.crt"), str(self.workdir / "admin.key"))
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))

    def _wait(self, what: str, proc: subprocess.Popen[bytes], log: Path, url: str,
              ok: Callable[[bytes], bool]) -> None:
        """Poll `url` until `ok(body)`; fail early if the process exits, late after `ready_timeout`."""
        opener = self._opener()
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer yet"
        while True:
            if proc.poll() is not None:
                raise ControlPlaneError(f"{what} exited with status {proc.returncode} while starting; "
                                        f"end of {log}:\n{_tail(log)}")
            try:
                with opener.open(url, timeout=5) as resp:
                    body = resp.read()
                if ok(body):
                    return
                last = body.decode(errors="replace")[-2000:]
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read().decode(errors='replace')[-2000:]}"
            except (OSError, ValueError) as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{what} not ready at {url} after {self.ready_timeout:.0f}s; last answer: "
                                        f"{last}\nend of {log}:\n{_tail(log)}")
            time.sleep(0.2)

    # kubectl ------------------------------------------------------------------------------------------

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (as admin unless `kubeconfig` says otherwise) and capture its output."""
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result


# --- CLI ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """`python -m devtools.controlplane up|down`."""
    parser = argparse.ArgumentParser(prog="python -m devtools.controlplane",
                                     description="run a local etcd + kube-apiserver on loopback")
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
    cp = ControlPlane(workdir=run_dir, ready_timeout=timeout)
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
            if len(cp.pids) < 2:
                print(f"error: a control-plane process exited; see the logs in {cp.workdir}", file=sys.stderr)
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
    for name in ("kube-apiserver", "etcd"):  # whatever is left, e.g. after `up` was SIGKILLed
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
    deadline = time.monotonic() + timeout
    while _same_process(entry):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    sys.exit(main())
