"""A container registry with throwaway storage, where a cluster's nodes can reach it: Debian's
`docker-registry` (the distribution registry) in the node tier's fabric namespace, on plain HTTP.

Inside, it answers at `address` (the fabric's address, port 5000), which the nodes' containerd pulls from
(`NodeCluster.trust_registry` writes their `hosts.toml`); here, at `local` (a loopback port leading in), which
`make release` pushes to. The two names are one registry, as a mirror and its source are to a cluster.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from devtools.clusters.host import FABRIC_IP
from devtools.clusters.netns import Namespace
from devtools.procs import spawn, tail, terminate
from devtools.waiting import until

REGISTRY_BIN = "/usr/bin/docker-registry"
PORT = 5000

CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 0.0.0.0:{port}
"""


class RegistryError(RuntimeError):
    """The registry did not start or answer; the message carries its log's tail."""


class Registry:
    """`docker-registry serve` inside `ns`, its storage under `workdir` (gone with it)."""

    def __init__(self, ns: Namespace, workdir: Path) -> None:
        self.ns = ns
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = f"{FABRIC_IP}:{PORT}"
        self.local = ""

    def start(self, timeout: float = 20.0) -> Registry:
        if not shutil.which(REGISTRY_BIN):
            raise RegistryError(f"{REGISTRY_BIN} is missing: `make release-test-tools` installs Debian's "
                                "docker-registry")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "registry.yml"
        config.write_text(CONFIG.format(root=self.workdir / "storage", port=PORT))
        log = self.workdir / "registry.log"
        proc = self.proc = spawn([*self.ns.prefix, REGISTRY_BIN, "serve", str(config)], log)
        self.local = f"127.0.0.1:{self.ns.forward(PORT)}"

        def answers() -> bool:
            if proc.poll() is not None:
                raise RegistryError(f"docker-registry exited with {proc.returncode}:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"http://{self.local}/v2/", timeout=2) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        until(f"docker-registry answering on {self.address}", answers, timeout, 0.1,
              fail=lambda m: RegistryError(f"{m}:\n{tail(log)}"))
        return self

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None
