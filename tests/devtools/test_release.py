"""The release's inputs and pure steps: what `make release` refuses, naming what the user typed, and what it
writes (the chart's pinned values, the notes, SHA256SUMS), and the OCI archive reader of the release tier."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from devtools import paths, release
from devtools.builds import oci

CHANGELOG = "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-12-05\n\n### Added\n- The webhooks.\n"


@pytest.mark.parametrize("registry", ["registry.example:5000", "10.244.0.1:5000", "harbor.example/hami/team",
                                      "127.0.0.1:39001", "ghcr.io/owner"])
def test_registry_accepted(registry: str) -> None:
    assert release.check_registry(registry) == registry


@pytest.mark.parametrize("registry", ["", "https://registry.example", "registry.example/", "Registry.Example",
                                      "registry.example:port", "a b"])
def test_registry_refused_naming_it(registry: str) -> None:
    with pytest.raises(release.ReleaseError, match=f"REGISTRY={registry!r}"):
        release.check_registry(registry)


def test_version_is_the_package_version_or_a_prerelease_of_it() -> None:
    assert release.check_version("0.1.0", "0.1.0", CHANGELOG) == "0.1.0"
    assert release.check_version("0.1.0-rc.1", "0.1.0", CHANGELOG) == "0.1.0-rc.1"
    with pytest.raises(release.ReleaseError, match=r"VERSION='0\.2\.0' is not the package's version 0\.1\.0"):
        release.check_version("0.2.0", "0.1.0", CHANGELOG)


def test_version_needs_its_changelog_section() -> None:
    with pytest.raises(release.ReleaseError, match="CHANGELOG.md"):
        release.check_version("0.1.0", "0.1.0", "# Changelog\n\n## [Unreleased]\n")


def test_key_required_and_must_exist(tmp_path: Path) -> None:
    with pytest.raises(release.ReleaseError, match="COSIGN_KEY=<cosign.key>"):
        release.check_key(None)
    with pytest.raises(release.ReleaseError, match="COSIGN_KEY='nope.key': no such file"):
        release.check_key("nope.key")
    (tmp_path / "k").write_text("x")
    assert release.check_key(str(tmp_path / "k")) == tmp_path / "k"


def test_chart_values_pinned_with_comments_kept() -> None:
    values = (paths.CHART / "values.yaml").read_text()
    digest = "sha256:" + "a" * 64
    pinned = release.pinned_values(values, "registry.example:5000", digest)
    loaded = yaml.safe_load(pinned)
    assert loaded["image"]["registry"] == "registry.example:5000"
    assert loaded["image"]["digest"] == digest
    original = yaml.safe_load(values)
    loaded["image"]["registry"], loaded["image"]["digest"] = original["image"]["registry"], original["image"]["digest"]
    assert loaded == original  # nothing else changed
    assert pinned.count("\n#") == values.count("\n#")


def test_chart_values_without_empty_image_fields_refused() -> None:
    with pytest.raises(release.ReleaseError, match="image.registry and image.digest"):
        release.pinned_values("image:\n  repository: x\n", "r", "sha256:" + "a" * 64)


def test_notes_name_every_digest_and_how_to_verify() -> None:
    rel = release.Release(version="0.1.0", registry="r.example", revision="abc", image="r.example/hami-mt-webhook",
                          index_digest="sha256:" + "1" * 64,
                          digests={"amd64": "sha256:" + "2" * 64, "arm64": "sha256:" + "3" * 64},
                          chart="r.example/charts/hami-mt-webhook", chart_digest="sha256:" + "4" * 64,
                          sizes_mb={"amd64": 120.0, "arm64": 118.0})
    text = release.notes(rel, "### Added\n- The webhooks.")
    for digest in (rel.index_digest, *rel.digests.values(), rel.chart_digest):
        assert digest in text
    assert "- The webhooks." in text
    assert f"cosign verify --key cosign.pub --insecure-ignore-tlog r.example/hami-mt-webhook@{rel.index_digest}" in text
    assert "helm install hami-mt-webhook oci://r.example/charts/hami-mt-webhook --version 0.1.0" in text


def test_notes_say_how_to_verify_and_install_the_python_package() -> None:
    rel = release.Release(version="0.1.0", registry="r.example", revision="abc",
                          python=["hami_mt_webhook-0.1.0-cp311-cp311-linux_x86_64.whl",
                                  "hami_mt_webhook-0.1.0-py3-none-any.whl", "hami_mt_webhook-0.1.0.tar.gz"])
    text = release.notes(rel, "")
    wheel = rel.python[0]
    assert f"--signature {wheel}.sig {wheel}" in text
    assert f"pip install '{wheel}[doctor]'" in text
    assert all(f"`{name}`" in text for name in rel.python)
    assert "pip install" not in release.notes(release.Release(version="0.1.0", registry="r", revision="a"), "")


def test_sha256sums_lists_each_file(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"bee")
    (tmp_path / "a").write_bytes(b"")
    text = release.sha256sums(tmp_path, ["b", "a"])
    assert text == (f"{hashlib.sha256(b'').hexdigest()}  a\n{hashlib.sha256(b'bee').hexdigest()}  b\n")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            _add(tar, name, data)
    return gzip.compress(buf.getvalue())


def _archive(path: Path, layers: list[dict[str, bytes]], manifests: int = 1) -> str:
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    config = json.dumps({"config": {"Entrypoint": ["/bin/x"]}}).encode()
    manifest = json.dumps({"config": {"digest": blob(config)}, "layers": [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blob(_layer(files))}
        for files in layers]}).encode()
    digest = blob(manifest)
    index = {"manifests": [{"digest": digest}] * manifests}
    with tarfile.open(path, "w") as tar:
        _add(tar, "index.json", json.dumps(index).encode())
        for d, data in blobs.items():
            _add(tar, "blobs/" + d.replace(":", "/"), data)
    return digest


def test_archive_digest_and_layers_applied_in_order(tmp_path: Path) -> None:
    archive = tmp_path / "image.oci.tar"
    digest = _archive(archive, [{"etc/a": b"1", "etc/b": b"2", "usr/c": b"3"},
                                {"etc/a": b"new", "etc/.wh.b": b"", "usr/.wh..wh..opq": b"", "usr/d": b"4"}])
    assert oci.archive_digest(archive) == digest
    config = oci.unpack(archive, tmp_path / "rootfs")
    assert config == {"config": {"Entrypoint": ["/bin/x"]}}
    root = tmp_path / "rootfs"
    assert (root / "etc" / "a").read_bytes() == b"new"
    assert not (root / "etc" / "b").exists()
    assert sorted(p.name for p in (root / "usr").iterdir()) == ["d"]


def test_archive_with_several_images_refused(tmp_path: Path) -> None:
    archive = tmp_path / "two.oci.tar"
    _archive(archive, [{"a": b"1"}], manifests=2)
    with pytest.raises(oci.OciError, match="holds 2 manifests, not one"):
        oci.archive_digest(archive)
