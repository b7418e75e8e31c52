"""The package as users install it: the wheel built from this tree, in a fresh virtualenv outside it.

Tests run the installed command from here, so a file the package reads from the repository, a module
left out of the wheel, or a missing dependency fails them as it would fail a user.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

from devtools import paths
from devtools.paths import REPO_ROOT

#: Installs kept by `install_cached`, one per source state, newest last.
CACHE = paths.CACHE / "installed"
KEEP = 3
#: An install unused this long (seconds) may go once more than `KEEP` exist.
STALE = 6 * 3600


@dataclass(frozen=True)
class Installed:
    """A virtualenv holding the built wheel; `exe` is its `hami-mt-webhook` command."""

    root: Path
    wheel: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def exe(self) -> Path:
        return self.root / "bin" / "hami-mt-webhook"


#: setup.py compiles the rules with mypyc unless this is "1".
PURE_ENV = "HAMI_MT_PURE_PYTHON"
#: What the Dockerfile copies before `pip wheel .`: the wheel is built from these alone.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "hami_mt_webhook")


def build(dest: Path, *, beside: tuple[str, ...] = (), pure: bool = False) -> Path:
    """Build the wheel into `dest` from a copy of `SOURCES` with the pip of a new virtualenv holding nothing
    but pip, as the image's build stage and `pip install` of an sdist do, and return its path.

    `beside` installs those packages into that virtualenv first: the build must not depend on what else
    is installed (mypy, inside pip's isolated build, looks at the interpreter's own site-packages). Not
    from the tree itself: setuptools keeps a `build/` directory beside the sources, and a module deleted
    since the last build would still be packed from there. `pure`: the rules left uncompiled
    (`HAMI_MT_PURE_PYTHON=1`), a `py3-none-any` wheel for any platform and Python.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hami-mt-wheel-") as tmp:
        src = copy_sources(Path(tmp) / "src")
        python = bare_python(Path(tmp) / "venv")
        if beside:
            _run([str(python), "-m", "pip", "install", "--quiet", *beside])
        _run([str(python), "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(src)],
             env={PURE_ENV: "1" if pure else "0"})
    return _one(dest, "hami_mt_webhook-*-none-any.whl" if pure else "hami_mt_webhook-*-cp*.whl")


def build_sdist(dest: Path) -> Path:
    """Build the sdist into `dest` as a user does (`pip install build`, then `python -m build --sdist`, in a
    new virtualenv) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hami-mt-sdist-") as tmp:
        src = copy_sources(Path(tmp) / "src")
        python = bare_python(Path(tmp) / "venv")
        _run([str(python), "-m", "pip", "install", "--quiet", "build"])
        _run([str(python), "-m", "build", "--sdist", "--outdir", str(dest), str(src)])
    return _one(dest, "hami_mt_webhook-*.tar.gz")


def copy_sources(src: Path) -> Path:
    """A copy of `SOURCES` at `src`, without bytecode."""
    src.mkdir(parents=True)
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, src / name)
    return src


def bare_python(env_dir: Path) -> Path:
    """A new virtualenv at `env_dir` with pip alone in it (no project dependency); its interpreter."""
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    return env_dir / "bin" / "python"


def _one(dest: Path, pattern: str) -> Path:
    found = sorted(dest.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"expected one {pattern} in {dest}, found {[w.name for w in found]}")
    return found[0]


def install(dest: Path) -> Installed:
    """Build the wheel and install it with its dependencies and the `doctor` extra (the Kubernetes client, as
    operators install the CLI) into a new virtualenv at `dest/venv`."""
    wheel = build(dest / "dist")
    installed = Installed(dest / "venv", wheel)
    bare_python(installed.root)
    _run([str(installed.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          f"{wheel}[doctor]"])
    return installed


def source_key() -> str:
    """A digest of everything the wheel is built from (the package, pyproject.toml, README) and the Python."""
    h = hashlib.sha256(sys.version.encode())
    files = [REPO_ROOT / "pyproject.toml", REPO_ROOT / "setup.py", REPO_ROOT / "README.md",
             *sorted(p for p in (REPO_ROOT / "hami_mt_webhook").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)]
    for path in files:
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def install_cached(cache: Path = CACHE) -> Installed:
    """`install`, once per source state: a fresh virtualenv for every change of the sources, reused while they
    stay the same (a test run started inside a test run, or the next run, finds it ready). Only the newest
    `KEEP` and any used in the last `STALE` seconds are kept. Nothing is left in the temporary directory."""
    key = source_key()
    done = cache / key
    if (done / "ok").exists():
        (done / "ok").touch()  # in use: not evicted by another tree's run
        return Installed(done / "venv", next((done / "dist").glob("*.whl")))
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:  # one installer at a time; scripts in a venv cannot be moved
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done / "ok").exists():
            shutil.rmtree(done, ignore_errors=True)  # an install that was cut short
            install(done)
            (done / "ok").write_text(key + "\n")
    entries = sorted((p for p in cache.iterdir() if (p / "ok").exists()),
                     key=lambda p: (p / "ok").stat().st_mtime)
    for old in entries[:-KEEP]:
        if time.time() - (old / "ok").stat().st_mtime > STALE:
            shutil.rmtree(old, ignore_errors=True)
    return Installed(done / "venv", next((done / "dist").glob("*.whl")))


def contents(wheel: Path) -> list[str]:
    """The file names inside a wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


#: Variables that would let the interpreter see packages outside the virtualenv it belongs to.
_LEAKS = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "VIRTUAL_ENV")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in _LEAKS} | {"PYTHONNOUSERSITE": "1"} | (env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT.parent, env=clean)
    if proc.returncode:
        output = proc.stdout[-2000:] + proc.stderr[-4000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{output}")
