"""An image as the offline bundle ships it (an OCI archive), unpacked and run without a container engine:
`chroot` for the machine's own architecture, and for arm64 the same chroot through `qemu-aarch64-static`
(Debian's qemu-user-static; no binfmt registration needed). What the release tier runs `review` with."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

QEMU = {"arm64": "/usr/bin/qemu-aarch64-static"}
#: Prints the interpreter's machine and where the compiled rules' shared library was loaded from.
PROBE = ("import platform, hami_mt_webhook.rules.pods as p, hami_mt_webhook__mypyc as lib;"
         "print(platform.machine()); print(p.__file__); print(lib.__file__)")


class OciError(RuntimeError):
    """The archive is not what it should be, or the command in it failed."""


def _member(layout: tarfile.TarFile, name: str) -> bytes:
    member = layout.extractfile(name)
    if member is None:
        raise OciError(f"the archive has no {name}")
    return member.read()


def _blob(layout: tarfile.TarFile, digest: str) -> bytes:
    return _member(layout, "blobs/" + digest.replace(":", "/"))


def _manifest_digest(layout: tarfile.TarFile, name: str) -> str:
    manifests = json.loads(_member(layout, "index.json"))["manifests"]
    if len(manifests) != 1:
        raise OciError(f"{name} holds {len(manifests)} manifests, not one")
    return str(manifests[0]["digest"])


def archive_digest(path: Path) -> str:
    """The digest of the one manifest an OCI archive's index names (what a registry knows the image by)."""
    with tarfile.open(path) as layout:
        return _manifest_digest(layout, path.name)


def unpack(archive: Path, rootfs: Path) -> dict[str, object]:
    """The image's layers extracted in order into `rootfs` (whiteouts applied); its config."""
    with tarfile.open(archive) as layout:
        manifest = json.loads(_blob(layout, _manifest_digest(layout, archive.name)))
        config: dict[str, object] = json.loads(_blob(layout, manifest["config"]["digest"]))
        rootfs.mkdir(parents=True, exist_ok=True)
        for layer in manifest["layers"]:
            data = _blob(layout, layer["digest"])
            if layer["mediaType"].endswith("gzip"):
                data = gzip.decompress(data)
            with tempfile.TemporaryFile() as fh:
                fh.write(data)
                fh.seek(0)
                with tarfile.open(fileobj=fh) as tar:
                    _apply(tar, rootfs)
    return config


def _apply(tar: tarfile.TarFile, rootfs: Path) -> None:
    keep = []
    for member in tar.getmembers():
        path = PurePosixPath(member.name)
        if path.name.startswith(".wh."):
            target = rootfs / path.parent / path.name[4:]
            if path.name == ".wh..wh..opq":
                target = rootfs / path.parent
                for child in target.iterdir() if target.is_dir() else []:
                    _remove(child)
            else:
                _remove(target)
            continue
        existing = rootfs / path
        if existing.is_symlink() or (existing.exists() and not existing.is_dir()):
            existing.unlink()
        keep.append(member)
    tar.extractall(rootfs, members=keep, filter="tar")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


@dataclass
class Review:
    """What `hami-mt-webhook review` printed in an image, and what ran it."""

    review: str
    exit_code: int
    machine: str
    compiled: bool
    seconds: float


def run_in(rootfs: Path, arch: str, argv: Sequence[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`argv` run chrooted in `rootfs`, through qemu for a foreign architecture."""
    prefix: list[str] = []
    if arch in QEMU:
        if not os.access(QEMU[arch], os.X_OK):
            raise OciError(f"{QEMU[arch]} is missing: Debian's qemu-user-static (make release-test-tools)")
        shutil.copy2(QEMU[arch], rootfs / "qemu")
        prefix = ["/qemu"]
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return subprocess.run([chroot, str(rootfs), *prefix, *argv], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin", "LANG": "C.UTF-8"})


def review_in_archive(archive: Path, arch: str, files: Sequence[Path | str], nodes: Path | str | None = None) -> Review:
    """`review -o json` on `files` (and `nodes`), inside the image of `archive`, as its entrypoint runs it."""
    with tempfile.TemporaryDirectory(prefix="hami-mt-oci-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        config = unpack(archive, rootfs)
        inner = config.get("config")
        entrypoint = list(inner.get("Entrypoint") or []) if isinstance(inner, dict) else []
        if not entrypoint:
            raise OciError(f"{archive.name} has no entrypoint")
        inside = rootfs / "review"
        inside.mkdir()
        args = []
        for f in files:
            shutil.copy2(f, inside / Path(f).name)
            args += ["-f", f"/review/{Path(f).name}"]
        if nodes is not None:
            shutil.copy2(nodes, inside / "nodes.yaml")
            args += ["--nodes", "/review/nodes.yaml"]
        started = time.monotonic()
        done = run_in(rootfs, arch, [*entrypoint, "review", "-o", "json", *args])
        seconds = time.monotonic() - started
        if done.returncode not in (0, 1):
            raise OciError(f"review in {archive.name} exited with {done.returncode}:\n{done.stderr[-3000:]}")
        probe = run_in(rootfs, arch, [entrypoint[0], "-c", PROBE])
        if probe.returncode != 0:
            raise OciError(f"the probe in {archive.name} failed:\n{probe.stderr[-3000:]}")
        machine, rules, library = probe.stdout.split()[:3]
        return Review(done.stdout, done.returncode, machine, rules.endswith(".so") and library.endswith(".so"),
                      seconds)
