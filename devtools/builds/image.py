"""The container image, built from the Dockerfile itself where there is no Docker daemon (`make image`).

podman builds it (`docker buildx build` takes the same Dockerfile; README), for linux/amd64 or linux/arm64:
the build stage runs on this machine's architecture and cross-compiles for arm64, the arm64 runtime stage
only copies, so nothing is emulated. Its bases resolve to images in local storage: the build base under the
official name `python:3.11-bookworm`, the runtime base (`RUNTIME`, distroless python3-debian12:nonroot) per
architecture as `runtime_base(arch)`, passed as the Dockerfile's RUNTIME argument. Each is the official
image once pulled or, where no container registry can be reached, a stand-in made from Debian 12's packages
with mmdebstrap (`make_standin`, `make_runtime_standin`), labelled `STANDIN_LABEL`. They are kept in the
container storage outside the tree, so only the first build makes them.

    python -m devtools.builds.image build [--bases auto|standin|pull] [--platform linux/amd64|linux/arm64]

prints the image's name: `localhost/hami-mt-webhook:<version>` for amd64 (the chart's default, and what the
node tier imports into containerd), `localhost/hami-mt-webhook:<version>-arm64` for arm64 (`reference_for`).
For a release: `build(mode, tag, say, platform, labels)` returns the name, `size_mb(name)` its size
(`devtools.builds.oci` runs an image of either architecture from its OCI archive).

The settings the machine needs are in a containers.conf of our own (`CONTAINERS_CONF`): runc as the
runtime, cgroupfs, and no default ulimits (raising RLIMIT_NOFILE needs CAP_SYS_RESOURCE, which a VM's
root may lack).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
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

from devtools import paths
from devtools.paths import REPO_ROOT
from hami_mt_webhook import __version__

#: The chart's `image.repository`; podman stores it as localhost/hami-mt-webhook.
REPOSITORY = "hami-mt-webhook"
CACHE = paths.CACHE / "image"
#: Set on the stand-in bases, so `podman image inspect` tells them from the official images.
STANDIN_LABEL = "org.hami-mt-webhook.standin"
#: The Debian release whose Python is 3.11, as the official python:3.11-bookworm image and distroless's.
SUITE = "bookworm"


@dataclass(frozen=True)
class Base:
    """A base image the Dockerfile names, and the Debian packages of its stand-in."""

    name: str
    packages: tuple[str, ...]


BASES = (
    # with arm64's cross compiler and Python headers, so the Dockerfile's step that would install them is skipped
    Base("docker.io/library/python:3.11-bookworm", (
        "python3", "python3-pip", "python3-venv", "python3-dev", "gcc", "libc6-dev", "ca-certificates",
        "gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "libpython3.11-dev:arm64")),
)
#: The Dockerfile's runtime base (its RUNTIME argument): Debian 12's Python 3.11, no shell, uid 65532.
RUNTIME = "gcr.io/distroless/python3-debian12:nonroot"
#: Where the runtime base is kept locally, one tag per architecture (`runtime_base`): pulled or a stand-in.
RUNTIME_LOCAL = "localhost/hami-mt-webhook-runtime"
RUNTIME_TAG = "python3-debian12-nonroot"
#: The runtime stand-in's packages (with their dependencies), as distroless's python3-debian12 has them.
RUNTIME_PACKAGES = ("base-files", "python3.11-minimal", "libpython3.11-stdlib", "ca-certificates", "tzdata",
                    "netbase")
#: Pulled in by dependencies but left out: a package manager and archiver, and what only they need.
RUNTIME_LEFT_OUT = frozenset({"dpkg", "tar", "libacl1", "libselinux1", "libpcre2-8-0", "libmd0", "libzstd1",
                              "debconf", "perl-base", "openssl", "bash", "dash", "coreutils", "mawk"})
#: What a server never reads (relative to the root).
RUNTIME_STRIPPED = (
    "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
    "usr/share/bug", "usr/share/debconf", "etc/cron.daily", "etc/logrotate.d", "usr/bin/pydoc3.11",
    "usr/bin/pygettext3.11", "usr/lib/python3.11/test", "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter", "usr/lib/python3.11/ensurepip", "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/pydoc_data", "usr/lib/python3.11/turtledemo", "usr/lib/python3.11/turtle.py",
    "usr/lib/python3.11/unittest/test", "usr/lib/python3.11/ctypes/test", "usr/lib/python3.11/sqlite3/test",
    "usr/lib/python3.11/distutils/tests", "usr/lib/python3.11/config-*",
)
#: Podman's architecture names, by the name Debian gives them and the one manylinux wheels carry.
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
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


def go_command(source: Path, repository: str, user: str = "65535:65535") -> str:
    """The Go command in `source` (a directory of this tree), built static and alone in an image FROM scratch,
    `localhost/<repository>:<12 hex of its source's sha256>`: built once per state of its source."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(source.iterdir()))).hexdigest()[:12]
    name = f"localhost/{repository}:{digest}"
    if exists(name):
        return name
    command = source.name
    with tempfile.TemporaryDirectory(prefix=f"{repository}-") as tmp:
        subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", f"{tmp}/{command}", "."],
                       cwd=source, env={**os.environ, "CGO_ENABLED": "0"}, check=True, capture_output=True,
                       timeout=600)
        return from_scratch(name, Path(tmp, command), f"/{command}", user)


def from_scratch(name: str, binary: Path, path: str, user: str) -> str:
    """`binary` alone in an image FROM scratch, at `path`, its entrypoint, run as `user` (numeric, so a chart's
    runAsNonRoot holds), tagged `name`: built only when podman lacks that tag (name it by the binary's digest)."""
    if exists(name):
        return name
    with tempfile.TemporaryDirectory(prefix="hami-mt-scratch-") as tmp:
        shutil.copy2(binary, Path(tmp) / binary.name)
        Path(tmp, "Containerfile").write_text(
            f'FROM scratch\nCOPY {binary.name} {path}\nUSER {user}\nENTRYPOINT ["{path}"]\n')
        run("build", "--quiet", "--runtime", "runc", "--tag", name, tmp)
    return name


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
        native = next((a for a, m in ARCHES.items() if m == os.uname().machine), "amd64")
        foreign = sorted({p.split(":")[1] for p in base.packages if ":" in p} - {native})
        arches = [f"--architectures={','.join([native, *foreign])}"] if foreign else []
        cmd = ["mmdebstrap", "--quiet", "--variant=minbase", *arches, "--include=" + ",".join(base.packages), *hooks,
               "--format=tar", SUITE, str(rootfs), *apt_sources()]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
        if done.returncode != 0:
            raise ImageError(f"mmdebstrap exited with {done.returncode}:\n{done.stderr[-4000:]}")
        changes = ["LABEL " + STANDIN_LABEL + "=" + standin_recipe(), "ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["python3"]']
        flags = [f for change in changes for f in ("--change", change)]
        run("import", "--quiet", *flags, str(rootfs), base.name)


def runtime_base(arch: str) -> str:
    """The local name of the runtime base for `arch` (amd64, arm64), passed to the Dockerfile as RUNTIME: one
    name per architecture, as container storage keeps one image per name."""
    return f"{RUNTIME_LOCAL}:{RUNTIME_TAG}-{arch}"


def make_runtime_standin(arch: str) -> None:
    """Make the stand-in for `RUNTIME` (distroless python3-debian12:nonroot) for `arch` and import it as
    `runtime_base(arch)`.

    mmdebstrap's extract variant resolves and downloads `RUNTIME_PACKAGES` with their dependencies for `arch`
    and runs no maintainer script, so arm64 needs no emulator. The packages are unpacked here by dpkg-deb,
    leaving out `RUNTIME_LEFT_OUT` (dpkg and tar, which readline-common pulls in, and what only they need: no
    shell, no package manager), then stripped of what a server never reads (`RUNTIME_STRIPPED`). As distroless
    does, /var/lib/dpkg/status.d/<package> holds each package's control fields for SBOM scanners, /etc/passwd
    and /etc/group hold root and nonroot (65532), and the standard library is byte-compiled (unchecked-hash
    .pyc files, valid however the files' times change; Debian's own Python 3.11, the same release, compiles
    them, so the foreign architecture is no obstacle).
    """
    if not shutil.which("mmdebstrap"):
        raise ImageError("mmdebstrap is not installed (make image installs it with apt-get as root)")
    with tempfile.TemporaryDirectory(prefix="hami-mt-runtime-") as tmp:
        fetched, root = Path(tmp) / "fetched", Path(tmp) / "rootfs"
        cmd = ["mmdebstrap", "--quiet", "--variant=extract", f"--architectures={arch}",
               "--include=" + ",".join(RUNTIME_PACKAGES), "--skip=cleanup/apt/cache", "--format=directory",
               SUITE, str(fetched), *apt_sources()]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
        if done.returncode != 0:
            raise ImageError(f"mmdebstrap exited with {done.returncode}:\n{done.stderr[-4000:]}")
        debs = sorted((fetched / "var/cache/apt/archives").glob("*.deb"))
        status = root / "var/lib/dpkg/status.d"
        status.mkdir(parents=True)
        for deb in debs:
            control = _check(["dpkg-deb", "--field", str(deb)])
            package = re.search(r"^Package: (\S+)", control, re.M)
            if not package or package[1] in RUNTIME_LEFT_OUT:
                continue
            _check(["dpkg-deb", "--extract", str(deb), str(root)])
            fields = re.sub(r"^(Package: .*)$", r"\1\nStatus: install ok installed", control.rstrip("\n"),
                            count=1, flags=re.M)
            (status / package[1]).write_text(fields + "\n")
        _finish_runtime(root)
        tar = Path(tmp) / "rootfs.tar"
        _check(["tar", "--create", "--file", str(tar), "--directory", str(root), "--numeric-owner",
                "--sort=name", "--mtime=@0", "."])
        changes = ["LABEL " + STANDIN_LABEL + "=" + standin_recipe(), "ENV LANG=C.UTF-8",
                   "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                   "ENV PATH=/usr/local/bin:/usr/bin:/bin", "USER 65532:65532", "WORKDIR /home/nonroot",
                   'ENTRYPOINT ["/usr/bin/python3.11"]']
        flags = [f for change in changes for f in ("--change", change)]
        run("import", "--quiet", "--arch", arch, "--os", "linux", *flags, str(tar), runtime_base(arch))


def _finish_runtime(root: Path) -> None:
    """Strip the unpacked packages, and add the users, /tmp, the certificate bundle and compiled stdlib."""
    for pattern in RUNTIME_STRIPPED:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for path in sorted(root.rglob("__pycache__"), reverse=True):
        shutil.rmtree(path, ignore_errors=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/sbin/nologin\n"
                                     "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
                                     "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
    (root / "usr/bin/python3").symlink_to("python3.11")  # as python3-minimal makes it, and distroless has it
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n")
    for directory, mode, owner in (("tmp", 0o1777, 0), ("root", 0o700, 0), ("home/nonroot", 0o700, 65532)):
        (root / directory).mkdir(parents=True, exist_ok=True)
        os.chmod(root / directory, mode)
        os.chown(root / directory, owner, owner)
    # ca-certificates' own bundle is made by its maintainer script, which the extract variant does not run
    certs = sorted((root / "usr/share/ca-certificates").rglob("*.crt"))
    (root / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssl/certs/ca-certificates.crt").write_text("".join(c.read_text() for c in certs))
    if sys.version_info[:2] == (3, 11):  # .pyc files are the release's, not the architecture's
        _check([sys.executable, "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash",
                "-s", str(root), "-p", "/", str(root / "usr/lib/python3.11")])


def _check(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise ImageError(f"{' '.join(cmd[:3])} ... exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def standin_recipe() -> str:
    """What the stand-ins' label says: the Debian release and a digest of how they are made (the packages and
    this code), so a changed recipe makes them again on the next build, here and on a machine that kept them."""
    source = "".join(inspect.getsource(f) for f in (make_standin, make_runtime_standin, _finish_runtime))
    recipe = repr((BASES, RUNTIME_PACKAGES, sorted(RUNTIME_LEFT_OUT), RUNTIME_STRIPPED, STANDIN_HOOKS, source))
    return f"debian-{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def ensure_bases(mode: str, say: Callable[[str], None] = print, arch: str = "amd64") -> None:
    """Have the build base and `arch`'s runtime base in local storage: kept if there; else `pull` pulls,
    `standin` makes a stand-in, and `auto` tries a pull first and makes the stand-in when no registry
    answers."""
    wanted: list[tuple[str, str, Callable[[], None]]] = [
        (base.name, base.name, lambda base=base: make_standin(base)) for base in BASES]  # type: ignore[misc]
    wanted.append((runtime_base(arch), RUNTIME, lambda: make_runtime_standin(arch)))
    for name, official, make in wanted:
        if exists(name):
            made_by = run("image", "inspect", "--format", f'{{{{index .Labels "{STANDIN_LABEL}"}}}}', name).stdout
            if made_by.strip() in ("", "<no value>", standin_recipe()):  # official, or a current stand-in
                continue
            say(f"{name} is a stand-in made by an older recipe ({made_by.strip()}): making it again")
            make()
            continue
        if mode in ("auto", "pull"):
            say(f"pulling {official} for linux/{arch}")
            pulled = run("pull", "--quiet", "--platform", f"linux/{arch}", official, check=False, timeout=300)
            if pulled.returncode == 0:
                if name != official:
                    run("tag", pulled.stdout.strip() or official, name)
                continue
            if mode == "pull":
                raise ImageError(f"could not pull {official}:\n{pulled.stderr[-2000:]}")
            say(f"no registry answered ({pulled.stderr.strip().splitlines()[-1:]}); making a stand-in")
        started = time.monotonic()
        make()
        say(f"made the stand-in {name} from Debian {SUITE}'s packages in {time.monotonic() - started:.0f} s")


def reference_for(platform: str = "linux/amd64", tag: str | None = None) -> str:
    """The image's name for `platform`: `reference(tag)` for amd64 (the chart's and the node tier's), the
    same with `-<arch>` appended to the tag for another architecture."""
    arch = _arch(platform)
    return reference(tag) if arch == "amd64" else reference(f"{tag or __version__}-{arch}")


def build(mode: str = "auto", tag: str | None = None, say: Callable[[str], None] = print,
          platform: str = "linux/amd64", labels: dict[str, str] | None = None, context: Path = REPO_ROOT) -> str:
    """Build the image for `platform` (linux/amd64 or linux/arm64) from the Dockerfile, the bases first (see
    `ensure_bases`); return its name (`reference_for`). `labels` become --label flags and, for the OCI
    labels the Dockerfile declares (`org.opencontainers.image.revision` and `.version`), build arguments.
    `context` is the tree built, its own Dockerfile included (another revision's: `devtools.release.previous`).

    The build stage runs on this machine's architecture whatever the platform (the Dockerfile's
    `FROM --platform=$BUILDPLATFORM`); for arm64 it cross-compiles, and the arm64 runtime stage only copies,
    so nothing is emulated."""
    arch = _arch(platform)
    ensure_bases(mode, say, arch)
    name = reference_for(platform, tag)
    # A build container trusts the machine's certificate authorities, as pip on this machine does.
    certs = ["--volume", "/etc/ssl/certs:/etc/ssl/certs:ro"] if Path("/etc/ssl/certs").is_dir() else []
    extra: list[str] = []
    for key, value in (labels or {}).items():
        extra += ["--label", f"{key}={value}"]
        if key in LABEL_ARGS:
            extra += ["--build-arg", f"{LABEL_ARGS[key]}={value}"]
    started = time.monotonic()
    run("build", "--pull=never", "--isolation", "chroot", "--runtime", "runc", "--layers", *certs,
        "--platform", f"linux/{arch}", *_platform_args(arch), "--build-arg", f"RUNTIME={runtime_base(arch)}",
        *extra,
        "--file", str(context / "Dockerfile"), "--tag", name, str(context), stdin=None)
    say(f"built {name} in {time.monotonic() - started:.0f} s, {size_mb(name):.0f} MB")
    return name


#: The Dockerfile's build arguments behind its OCI labels.
LABEL_ARGS = {"org.opencontainers.image.revision": "REVISION", "org.opencontainers.image.version": "VERSION",
              "org.opencontainers.image.source": "SOURCE"}


def _platform_args(arch: str) -> list[str]:
    """The platform arguments as BuildKit sets them; podman 4.3 sets TARGETARCH alone."""
    build = next((a for a, m in ARCHES.items() if m == os.uname().machine), "amd64")
    return [f for k, v in (("BUILDPLATFORM", f"linux/{build}"), ("BUILDARCH", build), ("BUILDOS", "linux"),
                           ("TARGETPLATFORM", f"linux/{arch}"), ("TARGETARCH", arch), ("TARGETOS", "linux"))
            for f in ("--build-arg", f"{k}={v}")]


def _arch(platform: str) -> str:
    arch = platform.removeprefix("linux/")
    if arch not in ARCHES:
        raise ImageError(f"unsupported platform {platform}: linux/amd64 or linux/arm64")
    return arch


def size_mb(name: str) -> float:
    """The image's size, as `podman images` prints it (uncompressed layers)."""
    done = run("image", "inspect", "--format", "{{.Size}}", name)
    return int(done.stdout.strip() or 0) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.builds.image", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the image from the Dockerfile and print its name")
    b.add_argument("--bases", choices=["auto", "standin", "pull"], default="auto",
                   help="where the build base (python:3.11-bookworm) and the runtime base (distroless "
                        "python3-debian12) come from when not in local storage: a pull, stand-ins made from "
                        "Debian's packages, or a pull and the stand-ins if it fails")
    b.add_argument("--tag", help="the image's tag (default: the package's version)")
    b.add_argument("--platform", choices=["linux/amd64", "linux/arm64"], default="linux/amd64",
                   help="the image's platform; linux/arm64 is cross-compiled, nothing emulated")
    args = parser.parse_args(argv)
    try:
        name = build(args.bases, args.tag, say=lambda line: print(line, file=sys.stderr), platform=args.platform)
    except ImageError as e:
        print(f"make image: {e}", file=sys.stderr)
        return 1
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
