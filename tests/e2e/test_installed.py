"""The wheel as users install it (`pip install .` into a fresh virtualenv outside the repository), every
subcommand it ships run from there. The rest of the e2e tier runs `serve` from the same install.

The wheel is built by the pip of a virtualenv that holds nothing but pip (`wheel.build`), as the image's
build stage and `pip install` of an sdist build it; the sdist is built and installed the same way here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from devtools.builds import wheel
from devtools.builds.binaries import BIN_ENV, helm
from devtools.builds.wheel import Installed
from devtools.paths import REPO_ROOT

from .support import newest_only

#: The clean builds, and the unit tiers on the compiled rules, do not depend on the Kubernetes version: they
#: run with the newest only.
NEWEST_ONLY = newest_only("builds do not depend on the Kubernetes version")

EXAMPLES = REPO_ROOT / "examples"


def run(installed: Installed, *args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(installed.exe), *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          input=stdin, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def test_the_wheel_is_the_package_alone(installed: Installed) -> None:
    names = wheel.contents(installed.wheel)
    tops = {name.split("/")[0] for name in names}
    runtime = {t for t in tops if t.startswith("hami_mt_webhook__mypyc.")}  # the compiled rules' shared library
    assert len(runtime) == 1 and next(iter(runtime)).endswith(".so")
    assert {t for t in tops - runtime if not t.endswith(".dist-info")} == {"hami_mt_webhook"}
    assert "hami_mt_webhook/admission/data/webhooks.yaml" in names
    # Exactly the tree's modules: none missing, and none left over from an earlier build.
    tree = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "hami_mt_webhook").rglob("*.py")
            if "__pycache__" not in p.parts}
    assert {n for n in names if n.endswith(".py")} == tree
    probe = subprocess.run([str(installed.python), "-c", "import devtools"], capture_output=True, text=True,
                           cwd="/")
    assert probe.returncode != 0 and "No module named 'devtools'" in probe.stderr


def test_help_and_version_of_every_subcommand(installed: Installed, tmp_path: Path) -> None:
    out = run(installed, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert listed == ["serve", "review", "doctor", "certs"]  # no development command ships
    for command in listed:
        sub = run(installed, command, "--help", cwd=tmp_path)
        assert sub.returncode == 0 and "usage: hami-mt-webhook " + command in sub.stdout, sub.stderr
    version = run(installed, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("hami-mt-webhook ")


def test_certs_writes_every_file_the_readme_applies(installed: Installed, tmp_path: Path) -> None:
    out = run(installed, "certs", "--dir", "certs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    made = tmp_path / "certs"
    readme = (REPO_ROOT / "README.md").read_text()
    for name in ("tls.crt", "tls.key", "ca.crt", "webhook-configurations.yaml"):
        assert f"certs/{name}" in readme, name  # the install steps use it
        assert (made / name).stat().st_size > 0, name
    docs = list(yaml.safe_load_all((made / "webhook-configurations.yaml").read_text()))
    # webhooks.yaml, workload-webhook.yaml and the rollout-mode copies of webhooks-warn.yaml (SPEC 4.10)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("MutatingWebhookConfiguration", "hami-mt-webhook"), ("ValidatingWebhookConfiguration", "hami-mt-webhook"),
        ("ValidatingWebhookConfiguration", "hami-mt-webhook-workloads"),
        ("MutatingWebhookConfiguration", "hami-mt-webhook-warn"),
        ("ValidatingWebhookConfiguration", "hami-mt-webhook-warn")]
    bundle = (made / "ca-bundle.crt").read_bytes()
    import base64
    for doc in docs:
        for hook in doc["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == bundle


def test_certs_into_an_unwritable_place_is_one_line_and_exit_2(installed: Installed, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = run(installed, "certs", "--dir", str(blocker / "certs"), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "Not a directory" in out.stderr


def test_review_checks_the_examples_as_the_source_tree_does(installed: Installed, tmp_path: Path) -> None:
    files = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "nodes.yaml")
    for path in files:
        out = run(installed, "review", "-f", str(path), "--nodes", str(EXAMPLES / "nodes.yaml"), "-o", "json",
                  cwd=tmp_path)
        assert out.stderr == "", (path.name, out.stderr)
        assert out.stdout == (EXAMPLES / "expected" / f"{path.stem}.json").read_text(), path.name
        assert out.returncode == (1 if "denied" in path.stem else 0), path.name
    piped = run(installed, "review", "-f", "-", "-o", "json", cwd=tmp_path,
                stdin=(EXAMPLES / "mixed-denied-pod.yaml").read_text())
    assert piped.returncode == 1 and json.loads(piped.stdout)["allowed"] is False


@NEWEST_ONLY
def test_the_rules_are_compiled_and_the_unit_tiers_pass_on_them(installed: Installed, tmp_path: Path) -> None:
    """The wheel's rules are mypyc modules (setup.py); the rules, admission, manifests and CLI tiers,
    hypothesis properties and fuzzing included, run here against those compiled modules, so compiled and
    pure Python cannot differ."""
    probe = subprocess.run([str(installed.python), "-c", "import hami_mt_webhook.rules.pods as p; print(p.__file__)"],
                           capture_output=True, text=True, cwd="/", timeout=60)
    assert probe.returncode == 0 and probe.stdout.strip().endswith(".so"), probe.stdout + probe.stderr
    site = Path(probe.stdout.strip()).parents[2]
    copy = tmp_path / "tree"
    for name in ("tests", "devtools", "examples", "docs", "manifests", "charts", "README.md", "pyproject.toml"):
        (shutil.copytree if (REPO_ROOT / name).is_dir() else shutil.copy2)(REPO_ROOT / name, copy / name)
    shutil.copytree(site / "hami_mt_webhook", copy / "hami_mt_webhook", ignore=shutil.ignore_patterns("__pycache__"))
    for lib in site.glob("hami_mt_webhook__mypyc.*.so"):
        shutil.copy2(lib, copy / lib.name)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not e2e",
                           "tests/rules", "tests/admission", "tests/manifests", "tests/cli"],
                          capture_output=True, text=True, cwd=copy, timeout=900,
                          env={**os.environ, BIN_ENV: str(helm().parent)})  # the copy has no build scripts
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]


@NEWEST_ONLY
def test_the_sdist_builds_and_installs_where_nothing_else_is_installed(tmp_path: Path) -> None:
    """`python -m build --sdist`, then `pip install` of it into a virtualenv holding only pip: pip builds
    the wheel from the sdist in its isolated environment (the rules compiled) and the command works."""
    sdist = wheel.build_sdist(tmp_path / "dist")
    python = wheel.bare_python(tmp_path / "venv")
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(sdist)], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    installed = Installed(tmp_path / "venv", sdist)
    out = run(installed, "review", "-f", str(EXAMPLES / "slice-pod.yaml"), "--nodes", str(EXAMPLES / "nodes.yaml"),
              "-o", "json", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == (EXAMPLES / "expected" / "slice-pod.json").read_text(), out.stderr
    probe = subprocess.run([str(installed.python), "-c", "import hami_mt_webhook.rules.pods as p; print(p.__file__)"],
                           capture_output=True, text=True, cwd="/", timeout=60)
    assert probe.stdout.strip().endswith(".so"), probe.stdout + probe.stderr


@NEWEST_ONLY
def test_the_wheel_builds_the_same_beside_the_runtime_dependencies(installed: Installed, tmp_path: Path) -> None:
    """With orjson installed beside pip (mypy in the build then finds its types) the compiled build gives
    the same wheel as where nothing is: what a machine has installed does not change what compiles."""
    beside = wheel.build(tmp_path / "dist", beside=("orjson",))
    assert sorted(wheel.contents(beside)) == sorted(wheel.contents(installed.wheel))
