"""One source for every shipped object: the kustomize base, its components' resources and the package's copies
are what the chart renders (devtools.clusters.shipped), so an edit to one of them alone fails here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from devtools.builds.binaries import helm as built_helm
from devtools.clusters import manifests, shipped
from devtools.paths import CHART, REPO_ROOT


@pytest.fixture(scope="module")
def helm() -> Path:
    return built_helm()


def test_every_generated_file_is_what_the_chart_renders(helm: Path) -> None:
    assert [str(p.relative_to(REPO_ROOT)) for p in shipped.check(helm)] == []


def test_a_cel_edit_in_the_chart_alone_names_every_file_it_reaches(helm: Path, tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert text.count("'v1|'") == 1
    helpers.write_text(text.replace("'v1|'", "'v2|'"))
    stale = {str(p.relative_to(REPO_ROOT)) for p in shipped.check(helm, chart)}
    # The record's condition is in the validating webhook and its warn copy, and in the package's copies.
    assert stale == {"manifests/webhooks.yaml", "manifests/webhooks-warn.yaml",
                     "hami_mt_webhook/admission/data/webhooks.yaml",
                     "hami_mt_webhook/admission/data/webhooks-warn.yaml"}


def test_the_base_is_the_default_rendering_without_what_certs_makes(helm: Path) -> None:
    """The chart's TLS Secret and caBundles are left out (`hami-mt-webhook certs` makes them), Helm's labels
    too; the Namespace is the one object added."""
    chart = {(d["kind"], d["metadata"]["name"]) for _, _, d in shipped.render(helm)}
    base = manifests.load()
    assert {(d["kind"], d["metadata"]["name"]) for d in base} == (chart - {("Secret", "hami-mt-webhook-tls")}
                                                                  | {("Namespace", "hami-mt-webhook")})
    assert not [h for d in base for h in d.get("webhooks", []) if "caBundle" in h["clientConfig"]]
    assert all(set(d["metadata"]["labels"]) & set(shipped.HELM_LABELS) == set() for d in base)


def test_each_component_lists_the_files_generated_for_it(helm: Path) -> None:
    generated = shipped.rendered_files(helm)
    components = manifests.base_dir() / "components"
    for directory in sorted(p for p in components.iterdir() if p.is_dir()):
        listed = yaml.safe_load((directory / "kustomization.yaml").read_text()).get("resources", [])
        ours = sorted(p.name for p in generated if p.parent == directory and p.name != "kustomization.yaml")
        assert sorted(listed) == ours, directory.name
