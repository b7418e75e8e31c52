"""The webhook as a local process beside a local control plane: the end-to-end tests, the benchmark and
`make run` (devtools/run.py).

The shipped manifests are applied through a local overlay (same rules, selectors, matchConditions and
timeouts; only the clientConfig points at 127.0.0.1), and the webhook logs in with a token of the
shipped ServiceAccount, so the shipped ClusterRole and binding are what it runs with.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import yaml

from devtools import procs
from devtools.clusters import manifests
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import NAMESPACE, RELEASE, SERVICE_ACCOUNT, helm
from devtools.paths import CHART
from devtools.waiting import NotWithin, until
from hami_mt_webhook.service import certs

#: What a webhook on loopback adds to its serving certificate (`certs --san`): the playground, the tests.
LOCAL_SANS = ("localhost", "127.0.0.1", "::1")


class LocalWebhook:
    """`hami-mt-webhook serve` in its own process, registered with the local API server."""

    def __init__(self, cp: ControlPlane, workdir: Path, *, port: int | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 certs_dir: Path | None = None, api_server: str | None = None) -> None:
        self.cp = cp
        self.api_server = api_server or cp.server  # where it watches Nodes (a test may put a proxy between)
        self.workdir = Path(workdir)
        self.port, self.health_port, self.metrics_port = procs.free_ports(3)
        self.port = port or self.port
        #: Where the probe listener is: a test of several replicas gives each a loopback address of its own.
        self.health_host = "127.0.0.1"
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        dns, ips = certs.split_sans(LOCAL_SANS)  # the webhook is reached on loopback
        self.certs = certs.ensure(certs_dir or self.workdir / "certs", extra_dns=dns, ips=ips)
        self.log = self.workdir / f"webhook-{self.port}.log"
        self.kubeconfig = self.workdir / "webhook.kubeconfig"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def install(self, url: str | None = None) -> None:
        """Apply the manifests' local overlay (calling `url`, by default this process) and write a
        kubeconfig for the shipped ServiceAccount."""
        overlay = manifests.local_overlay(self.workdir / "overlay", url or self.url,
                                          self.certs.bundle.read_bytes())
        self.cp.kubectl("apply", "-k", str(overlay))
        self.login()

    def install_chart(self) -> None:
        """Install the Helm chart instead (`make run INSTALL=helm`), as the README's Helm section does: the
        namespace made and labelled first, then the release, its webhooks calling this process (the chart's
        `development` values) and the webhook logged in as the chart's ServiceAccount."""
        self.cp.kubectl("create", "namespace", NAMESPACE)
        self.cp.kubectl("label", "namespace", NAMESPACE, "hami.io/webhook=ignore",
                        "pod-security.kubernetes.io/enforce=restricted")
        bundle = base64.b64encode(self.certs.bundle.read_bytes()).decode()
        helm(self.cp, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
             "--set", f"development.webhookURL={self.url}", "--set", f"development.caBundle={bundle}")
        self.login()

    def login(self) -> None:
        """A kubeconfig for the ServiceAccount the manifests or the chart made: the webhook runs with their
        RBAC."""
        token = self.cp.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                                "--duration=24h").stdout.strip()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "webhook",
            "clusters": [{"name": "local", "cluster": {"server": self.api_server,
                                                        "certificate-authority": str(self.cp.ca_file)}}],
            "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": "webhook", "context": {"cluster": "local", "user": SERVICE_ACCOUNT}}],
        }
        certs.write_atomic(self.kubeconfig, yaml.safe_dump(config).encode(), 0o600)

    #: How `serve` starts: this interpreter's package by default; the e2e tier sets the installed wheel's
    #: command.
    command_prefix: tuple[str, ...] = (sys.executable, "-m", "hami_mt_webhook")

    def command(self) -> list[str]:
        return [*self.command_prefix, "serve", "--listen", "127.0.0.1",
                "--port", str(self.port), "--health-listen", self.health_host,
                "--health-port", str(self.health_port),
                "--metrics-port", str(self.metrics_port), "--cert-file", str(self.certs.tls_cert),
                "--key-file", str(self.certs.tls_key), "--kubeconfig", str(self.kubeconfig), *self.extra_args]

    def start(self, timeout: float = 60.0, wait_ready: bool = True) -> None:
        """Start the process and wait until /readyz says the node view is synced (or only /livez)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        # Dies with us, even by SIGKILL, like the control plane's processes: never left retrying its watch.
        proc = self.proc = procs.spawn(self.command(), self.log, env=env)

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the webhook exited with {proc.returncode}:\n{self.tail()}")
            return self.ready() if wait_ready else self.live()

        try:
            until(f"the webhook {'ready' if wait_ready else 'live'}", up, timeout, 0.2)
        except NotWithin as e:
            self.stop()
            raise NotWithin(f"{e}:\n{self.tail()}") from None

    def ready(self) -> bool:
        return self._probe("readyz")

    def live(self) -> bool:
        return self._probe("livez")

    def _probe(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.health_host}:{self.health_port}/{path}", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.health_host}:{self.metrics_port}/metrics", timeout=2) as r:
            return r.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Stop the process; returns its exit code (SIGKILL after `timeout`)."""
        return procs.terminate(self.proc, timeout, sig) if self.proc is not None else None

    def tail(self, lines: int = 40) -> str:
        return procs.tail(self.log, lines).rstrip("\n")
