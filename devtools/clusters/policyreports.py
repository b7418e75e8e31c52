"""Kyverno's wgpolicyk8s.io PolicyReport CRDs as Kyverno releases them: the schema the audit's reports are
held to (policy-reporter reads the objects these define), and what the chart's `files/crds` must equal.

Taken from Kyverno's Go module (`config/crds/policyreport`), through the Go module proxy, into a cache keyed
by Kyverno's version, so the tests compare with Kyverno's own files, never with a copy of ours.

    python -m devtools.clusters.policyreports    (prints the cached files' paths)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from devtools import paths

__all__ = ["FILES", "KYVERNO", "crds"]

MODULE = "github.com/kyverno/kyverno"
KYVERNO = "v1.19.1"
FILES = ("wgpolicyk8s.io_policyreports.yaml", "wgpolicyk8s.io_clusterpolicyreports.yaml")
IN_MODULE = Path("config/crds/policyreport")
CACHE = paths.CACHE / "policyreports" / KYVERNO


def crds() -> list[Path]:
    """The two CRD files, downloaded once (`go mod download`, about 11 MB) into the cache."""
    found = [CACHE / name for name in FILES]
    if all(p.is_file() for p in found):
        return found
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE.parent) as tmp:
        env = {**os.environ, "GOMODCACHE": f"{tmp}/mod", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
        out = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{KYVERNO}"], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"go mod download {MODULE}@{KYVERNO} failed:\n{out.stdout}{out.stderr}")
        source = Path(json.loads(out.stdout)["Dir"]) / IN_MODULE
        for name in FILES:
            shutil.copyfile(source / name, CACHE / f".{name}")
            (CACHE / f".{name}").replace(CACHE / name)
        subprocess.run(["chmod", "-R", "u+w", tmp], check=True)  # the module cache is read-only
    return found


if __name__ == "__main__":
    for path in crds():
        print(path)
