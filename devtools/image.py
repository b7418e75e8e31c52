"""The container image, built from the Dockerfile itself where there is no Docker daemon (`make image`).

podman builds it (`buildah bud` and `docker build` take the same Dockerfile; README). The
Dockerfile's `FROM python:3.11` and `FROM python:3.11-slim` resolve to images in local storage: the
official ones once pulled or, where no container registry can be reached, stand-ins made from Debian's
packages with mmdebstrap (Debian 12's Python 3.11 and pip; the build one with a C compiler for the
compiled rules), tagged with the official names and labelled `STANDIN_LABEL`. Either way they are kept
in the container storage outside the tree, so only the first build makes them.

    python -m devtools.image build [--bases auto|standin|pull]    prints the image's name and tag

The settings the machine needs are in a containers.conf of our own (`CONTAINERS_CONF`): runc as the
runtime, cgroupfs, and no default ulimits (raising RLIMIT_NOFILE needs CAP_SYS_RESOURCE, which a VM's
root may lack).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hami_mt_webhook import __version__

ROOT = Path(__file__).resolve().parent.parent
#: The chart's `image.repository`; podman stores it as localhost/hami-mt-webhook.
REPOSITORY = "hami-mt-webhook"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hami-mt-webhook" / "image"
#: Set on the stand-in bases, so `podman image inspect` tells them from the official images.
STANDIN_LABEL = "org.hami-mt-webhook.standin"
#: The Debian release whose Python is 3.11, as the official python:3.11 images.
SUITE = "bookworm"


@dataclass(frozen=True)
class Base:
    """A base image the Dockerfile names, and the Debian packages of its stand-in."""

    name: str
    packages: tuple[str, ...]


BASES = (
    Base("docker.io/library/python:3.11", ("python3", "python3-pip", "python3-venv", "python3-dev", "gcc",
                                            "libc6-dev", "ca-certificates")),
    Base("docker.io/library/python:3.11-slim", ("python3", "python3-pip", "ca-certificates")),
)
#: What the official images set and the stand-ins copy: `python` on PATH, no PEP 668 marker (Debian's
#: would refuse the Dockerfile's `pip install`), UTF-8.
STANDIN_HOOKS = (
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
    'ln -sf /usr/bin/python3 "$1"/usr/local/bin/python',
    'ln -sf /usr/bin/pip3 "$1"/usr/local/bin/pip',
)
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class ImageError(RuntimeError):
    """A step of the build failed; the message says which and what it printed."""


def reference(tag: str | None = None) -> str:
    """The image's full name in local storage, as the chart's defaults name it."""
    return f"localhost/{REPOSITORY}:{tag or __version__}"


def engine() -> str:
    """podman: the command that builds and runs images here."""
    found = shutil.which("podman")
    if not found:
        raise ImageError("podman is not installed (make image installs it with apt-get as root; elsewhere "
                         f"install it, or run `docker build -t hami-mt-webhook:{__version__} .`)")
    return found


def environment() -> dict[str, str]:
    """The process environment with our containers.conf."""
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def run(*args: str, timeout: float = 1800, check: bool = True,
        stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """podman with our containers.conf; an ImageError with its output when it fails."""
    cmd = [engine(), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=environment(), timeout=timeout, stdin=stdin)
    if check and done.returncode != 0:
        raise ImageError(f"{' '.join(cmd[:3])} ... exited with {done.returncode}:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return done


def exists(name: str) -> bool:
    return run("image", "exists", name, check=False).returncode == 0


def apt_sources() -> list[str]:
    """The machine's apt source files that name the stand-ins' Debian release: mmdebstrap takes its mirror
    from them, as apt here does."""
    apt = Path("/etc/apt")
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list")),
             *sorted((apt / "sources.list.d").glob("*.sources"))]
    found = [str(f) for f in files if f.is_file() and re.search(rf"^[^#]*\b{SUITE}\b", f.read_text(), re.M)]
    if not found:
        raise ImageError(f"no apt source for Debian {SUITE} on this machine: the stand-in bases are made "
                         f"from its packages (or pull the official ones: --bases pull)")
    return found


def make_standin(base: Base) -> None:
    """Make `base.name` from Debian's packages with mmdebstrap, and import it into the container storage."""
    if not shutil.which("mmdebstrap"):
        raise ImageError("mmdebstrap is not installed (make image installs it with apt-get as root)")
    with tempfile.TemporaryDirectory(prefix="hami-mt-standin-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        hooks = [f"--customize-hook={hook}" for hook in STANDIN_HOOKS]
        cmd = ["mmdebstrap", "--quiet", "--variant=minbase", "--include=" + ",".join(base.packages), *hooks,
               "--format=tar", SUITE, str(rootfs), *apt_sources()]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
        if done.returncode != 0:
            raise ImageError(f"mmdebstrap exited with {done.returncode}:\n{done.stderr[-4000:]}")
        changes = ["LABEL " + STANDIN_LABEL + "=debian-" + SUITE, "ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["python3"]']
        flags = [f for change in changes for f in ("--change", change)]
        run("import", "--quiet", *flags, str(rootfs), base.name)


def ensure_bases(mode: str, say: Callable[[str], None] = print) -> None:
    """Have both bases in local storage: kept if there; else `pull` pulls, `standin` makes a stand-in, and
    `auto` tries a pull first and makes the stand-in when no registry answers."""
    for base in BASES:
        if exists(base.name):
            continue
        if mode in ("auto", "pull"):
            say(f"pulling {base.name}")
            pulled = run("pull", "--quiet", base.name, check=False, timeout=300)
            if pulled.returncode == 0:
                continue
            if mode == "pull":
                raise ImageError(f"could not pull {base.name}:\n{pulled.stderr[-2000:]}")
            say(f"no registry answered ({pulled.stderr.strip().splitlines()[-1:]}); making a stand-in")
        started = time.monotonic()
        make_standin(base)
        say(f"made the stand-in {base.name} from Debian {SUITE}'s packages in "
            f"{time.monotonic() - started:.0f} s")


def build(mode: str = "auto", tag: str | None = None, say: Callable[[str], None] = print) -> str:
    """Build the image from the Dockerfile (the bases first, see `ensure_bases`); return its name."""
    ensure_bases(mode, say)
    name = reference(tag)
    # A build container trusts the machine's certificate authorities, as pip on this machine does.
    certs = ["--volume", "/etc/ssl/certs:/etc/ssl/certs:ro"] if Path("/etc/ssl/certs").is_dir() else []
    started = time.monotonic()
    run("build", "--pull=never", "--isolation", "chroot", "--runtime", "runc", "--layers", *certs,
        "--file", str(ROOT / "Dockerfile"), "--tag", name, str(ROOT), stdin=None)
    say(f"built {name} in {time.monotonic() - started:.0f} s, {size_mb(name):.0f} MB")
    return name


def size_mb(name: str) -> float:
    """The image's size, as `podman images` prints it (uncompressed layers)."""
    done = run("image", "inspect", "--format", "{{.Size}}", name)
    return int(done.stdout.strip() or 0) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.image", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the image from the Dockerfile and print its name")
    b.add_argument("--bases", choices=["auto", "standin", "pull"], default="auto",
                   help="where python:3.11 and python:3.11-slim come from when not in local storage: a pull, "
                        "stand-ins made from Debian's packages, or a pull and the stand-ins if it fails")
    b.add_argument("--tag", help="the image's tag (default: the package's version)")
    args = parser.parse_args(argv)
    try:
        name = build(args.bases, args.tag, say=lambda line: print(line, file=sys.stderr))
    except ImageError as e:
        print(f"make image: {e}", file=sys.stderr)
        return 1
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
