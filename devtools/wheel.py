"""The package as users install it: the wheel built from this tree, in a fresh virtualenv outside it.

Tests run the installed command from here, so a file the package reads from the repository, a module
left out of the wheel, or a missing dependency fails them as it would fail a user.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def build(dest: Path) -> Path:
    """Build the wheel of this tree into `dest` (as `pip install .` would build it) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(ROOT)])
    wheels = sorted(dest.glob("hami_mt_webhook-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def install(dest: Path) -> Installed:
    """Build the wheel and install it with its dependencies into a new virtualenv at `dest/venv`."""
    wheel = build(dest / "dist")
    env_dir = dest / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    installed = Installed(env_dir, wheel)
    _run([str(installed.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)])
    return installed


def contents(wheel: Path) -> list[str]:
    """The file names inside a wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT.parent)
    if proc.returncode:
        output = proc.stdout[-2000:] + proc.stderr[-4000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{output}")
