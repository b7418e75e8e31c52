"""The release tier: `make release` to a registry inside the node tier's fabric, then the chart installed
from it as a cluster installs a release (`helm install oci://…`, the image pulled by containerd by digest),
signatures, the SBOM attestation, the offline bundle, and the arm64 image run under qemu.

It needs root, the node tier's tools, Debian's docker-registry, skopeo and qemu-user-static
(`make release-test-tools`), cosign and syft (`make release-tools`), and minutes, so it runs only when
asked: `pytest -m release` (`make test-release`, and in `make test`). What it measured is printed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools import paths, release
from devtools.builds.binaries import ControlPlaneError
from devtools.clusters import helm_release
from devtools.clusters.nodes import NodeCluster
from devtools.clusters.registry import Registry, RegistryError
from tests.tiers import Tier

TIER = Tier("release", __file__, "release tier")
MEASURED = TIER.measured
pytest_collection_modifyitems, pytest_terminal_summary = TIER.hooks()


@dataclass
class Published:
    """The cluster, its registry, and what `make release` published to it."""

    cluster: NodeCluster
    registry: Registry
    dist: Path
    key: Path
    other_key: Path
    tools: release.Tools
    made: dict[str, Any]

    @property
    def version(self) -> str:
        return str(self.made["version"])

    def cosign(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        http = [] if args[0].endswith("-blob") else ["--allow-http-registry"]
        cmd = [str(self.tools.bin_dir / "cosign"), *args[:1], *http, *args[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.tools.env, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited with {done.returncode}:\n{done.stderr}")
        return done


def key_pair(tools: release.Tools, directory: Path) -> Path:
    """A throwaway cosign key pair (empty password); the private key's path."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(tools.bin_dir / "cosign"), "generate-key-pair", "--output-key-prefix",
                    str(directory / "cosign")], cwd=directory, env=tools.env, check=True,
                   capture_output=True, timeout=60)
    return directory / "cosign.key"


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    work = tmp_path_factory.mktemp("release")
    try:
        tools = release.Tools(release.release_tools(), Path(), plain_http=True)
    except release.ReleaseError as e:
        pytest.fail(str(e), pytrace=False)
    key = key_pair(tools, work / "key")
    other = key_pair(tools, work / "other-key")
    started = time.monotonic()
    cluster = NodeCluster(1, images=[])  # nothing imported: the node pulls the release from the registry
    try:
        cluster.start()
        assert cluster.fabric is not None
        registry = Registry(cluster.fabric, cluster.workdir / "registry").start()
        cluster.trust_registry(registry.address)
    except (ControlPlaneError, RuntimeError, RegistryError) as e:
        cluster.stop()
        pytest.fail(f"the cluster or its registry did not start:\n{e}", pytrace=False)
    try:
        dist = work / "dist"
        made_at = time.monotonic()
        done = subprocess.run(
            ["make", "--no-print-directory", "-C", str(paths.REPO_ROOT), "release", f"REGISTRY={registry.local}",
             f"COSIGN_KEY={key}", "PLAIN_HTTP=1", "IMAGE_BASES=standin", f"DIST={dist}"],
            capture_output=True, text=True, env={**os.environ, "COSIGN_PASSWORD": ""}, timeout=1800)
        if done.returncode != 0:
            pytest.fail(f"make release failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}", pytrace=False)
        made = json.loads((dist / "release.json").read_text())
        MEASURED.append(f"make release (both architectures, push, SBOMs, signatures): "
                        f"{time.monotonic() - made_at:.0f} s; image {made['sizes_mb']} MB uncompressed")
        yield Published(cluster, registry, dist, key, other, tools, made)
    finally:
        registry.stop()
        cluster.stop()
        MEASURED.append(f"tier session {time.monotonic() - started:.0f} s")


@pytest.fixture(scope="session")
def installed(published: Published) -> Published:
    """The chart from the registry, with nothing set but where the nodes reach the registry."""
    chart = [f"oci://{published.made['chart']}", "--version", published.version, "--plain-http"]
    try:
        seconds = helm_release.install(published.cluster, chart=chart,
                                              values=[f"image.registry={published.registry.address}"])
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    MEASURED.append(f"helm install oci://… to 3 replicas Ready (the image pulled): {seconds:.1f} s")
    return published
