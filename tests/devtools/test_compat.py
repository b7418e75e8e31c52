"""The supported Kubernetes range has one statement per place that states it, and they agree; `make compat`
reads pytest's summary and writes its table between the markers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from devtools.builds.binaries import REPO_ROOT, pinned_versions
from devtools.scenarios import compat
from hami_mt_webhook.doctor.model import NEWEST_TESTED, OLDEST_TESTED


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.removeprefix("v").split(".")[:2]
    return int(major), int(minor)


def test_the_pins_the_doctor_the_chart_and_the_docs_name_one_range():
    pins = pinned_versions()
    assert (_minor(pins[0]), _minor(pins[-1])) == (OLDEST_TESTED, NEWEST_TESTED)
    oldest, newest = (f"{v[0]}.{v[1]}" for v in (OLDEST_TESTED, NEWEST_TESTED))
    chart = yaml.safe_load((REPO_ROOT / "charts" / "hami-mt-webhook" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={oldest}.0-0"
    assert f"**Kubernetes {oldest} to {newest}** are supported" in (REPO_ROOT / "README.md").read_text()
    assert f"supports Kubernetes **{oldest} to {newest}**" in compat.DOC.read_text()
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    for pin in pins:
        major, minor = _minor(pin)
        pinned = rf"`controlplane/pins/kubernetes/v{major}\.{minor}/`( pins Kubernetes)? {re.escape(pin)}\b"
        assert re.search(pinned, readme)


def test_compat_covers_every_minor_between_the_pins():
    assert compat.minors(None) == [f"1.{m}" for m in range(OLDEST_TESTED[1], NEWEST_TESTED[1] + 1)]
    assert compat.minors("1.33, v1.35.4") == ["1.33", "1.35.4"]


SUMMARY = "5 failed, 174 passed, 1 skipped, 1451 deselected, 4 errors in 422.11s (0:07:02)"


def test_a_run_is_read_from_pytest_summary_and_outcome_lines(monkeypatch, tmp_path: Path):
    class Done:
        returncode = 1
        stdout = "\n".join(["....F", "SKIPPED [1] tests/e2e/x.py:3: needs 1.36", "FAILED tests/e2e/y.py::t - boom",
                            "ERROR tests/e2e/z.py::u", SUMMARY])

    monkeypatch.setattr(compat, "binaries", lambda v: tmp_path / f"v{v}.9-etcd-v3.6.16-helm-v4.3.2-abc")
    monkeypatch.setattr(compat.subprocess, "run", lambda *a, **k: Done())
    outcome = compat.run_one("1.33", [])
    assert outcome.server == "v1.33.9"
    assert outcome.counts == {"failed": 5, "passed": 174, "skipped": 1, "deselected": 1451, "errors": 4}
    assert outcome.problems == ["tests/e2e/y.py::t - boom", "tests/e2e/z.py::u"]
    assert outcome.skipped == ["tests/e2e/x.py:3: needs 1.36"]
    assert re.match(r"\| v1\.33\.9 \| 174 \| 9 \| 1 \| [\d.]+ \| tests/e2e/y\.py::t - boom; ", outcome.row())


def test_the_table_goes_between_the_markers_and_nowhere_else(tmp_path: Path):
    doc = tmp_path / "c.md"
    doc.write_text(f"# t\n\nbefore\n{compat.BEGIN}\nold\n{compat.END}\nafter\n")
    compat.write(doc, "| new |")
    assert doc.read_text() == f"# t\n\nbefore\n{compat.BEGIN}\n| new |\n{compat.END}\nafter\n"
    compat.write(doc, "| newer |")
    assert "| new |" not in doc.read_text() and doc.read_text().count(compat.BEGIN) == 1
    (tmp_path / "bare.md").write_text("# no markers\n")
    with pytest.raises(SystemExit, match="lacks the markers"):
        compat.write(tmp_path / "bare.md", "| x |")


def test_the_table_names_each_skip_reason_once_below_the_rows():
    a, b = compat.Outcome("1.30", "v1.30.14", {"passed": 3}), compat.Outcome("1.31", "v1.31.13", {"passed": 3})
    a.skipped = b.skipped = ["t.py:1: run only by another test"]
    text = compat.table([a, b])
    assert text.count("run only by another test") == 1 and text.endswith("Skipped: t.py:1: run only by another test.")
    assert "| v1.30.14 | 3 | 0 | 0 | 0.0 | all passed |" in text
