"""devtools.release.previous: the previous release's tree exported from its revision, as the node tier upgrades
from it."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from devtools import paths
from devtools.release import previous


def test_a_revision_must_be_a_full_commit_id() -> None:
    with pytest.raises(previous.PreviousError, match=r"revision '793e57e': a full commit id"):
        previous.Previous("0.1.0", "793e57e")


def test_the_image_tag_names_the_revision_not_the_version_this_tree_may_share() -> None:
    rel = previous.RELEASE
    assert rel.image == f"localhost/hami-mt-webhook:rev-{rel.revision[:12]}"
    assert rel.tree.name == rel.revision and rel.tree.parent.name == "previous"


def test_the_release_tree_is_the_versions_chart_and_dockerfile() -> None:
    tree = previous.export(previous.RELEASE)
    chart = yaml.safe_load((previous.RELEASE.chart / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == previous.RELEASE.version
    assert (tree / "Dockerfile").is_file() and not (tree / ".git").exists()


def test_a_commit_missing_from_the_clone_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(previous, "CACHE", tmp_path / "previous")
    with pytest.raises(previous.PreviousError, match=r"commit 0{40} \(release 9\.9\.9\) is not in this clone"):
        previous.export(previous.Previous("9.9.9", "0" * 40))


def test_a_shallow_clone_fetches_the_release_commit_from_its_origin(tmp_path, monkeypatch) -> None:
    """CI may clone with --depth 1: the release's commit is then fetched, that one commit only."""
    previous.fetch_commit(previous.RELEASE)  # this clone may be shallow too: the sub-clone's origin needs it
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--depth=1", "--no-local", f"file://{paths.REPO_ROOT}",
                    str(clone)], check=True, capture_output=True)
    monkeypatch.setattr(previous, "REPO_ROOT", clone)
    monkeypatch.setattr(previous, "CACHE", tmp_path / "previous")
    rel = previous.RELEASE
    assert not previous._has_commit(rel.revision)
    tree = previous.export(rel)
    assert tree == tmp_path / "previous" / rel.revision
    assert yaml.safe_load((rel.chart / "Chart.yaml").read_text())["version"] == rel.version
