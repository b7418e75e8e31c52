"""The release's version, written where each tool reads it, agrees everywhere: a release bumps it in one
place and this test names each file that was forgotten."""

from __future__ import annotations

import re
import tomllib

import yaml

import hami_mt_webhook
from devtools.paths import CHART, MANIFESTS, REPO_ROOT


def written_versions() -> dict[str, str]:
    """Each place the version is written, by where (file and field), and what it says there."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    arg = re.search(r"^ARG VERSION=(\S+)$", dockerfile, re.M)
    images = re.findall(r"^\s*image: hami-mt-webhook:(\S+)$", (MANIFESTS / "deployment.yaml").read_text(), re.M)
    return {
        "pyproject.toml [project] version": tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
            "version"],
        "hami_mt_webhook/__init__.py __version__": hami_mt_webhook.__version__,
        "charts/hami-mt-webhook/Chart.yaml version": str(chart["version"]),
        "charts/hami-mt-webhook/Chart.yaml appVersion": str(chart["appVersion"]),
        "Dockerfile ARG VERSION": arg[1] if arg else "(none)",
        **{f"manifests/deployment.yaml image tag #{i + 1}": tag for i, tag in enumerate(images)},
    }


def test_every_file_that_writes_the_version_agrees_with_pyproject() -> None:
    found = written_versions()
    assert any(k.startswith("manifests/") for k in found), "manifests/deployment.yaml names no image tag"
    want = found["pyproject.toml [project] version"]
    wrong = [f"{where} says {said!r}" for where, said in found.items() if said != want]
    assert not wrong, f"pyproject.toml says {want!r}, but " + "; ".join(wrong)
