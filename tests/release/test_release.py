"""The release as a cluster takes it: installed from the registry by digest, verified by key, its SBOM and
offline bundle, and the arm64 image run under qemu."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import yaml

from devtools import release
from devtools.builds import image, oci, wheel
from devtools.clusters import helm_release
from devtools.paths import REPO_ROOT
from tests.release.conftest import MEASURED, Published

SLICE_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice"},
             "spec": {"containers": [{"name": "main", "image": "example.invalid/train:1", "resources": {
                 "limits": {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
                            "mthreads.com/sgpu-core": "8"}}}]}}


def pods(p: Published) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        p.cluster.kubectl("get", "pods", "-n", helm_release.NAMESPACE, "-o", "json").stdout)["items"]
    return items


def test_replicas_run_the_pushed_digest(installed: Published) -> None:
    made = installed.made
    running = [pod for pod in pods(installed) if pod["status"]["phase"] == "Running"]
    assert len(running) == 3
    want = f"{installed.registry.address}/{release.NAME}@{made['index_digest']}"  # the chart's digest, our mirror
    image_ids = set()
    for pod in running:
        assert pod["spec"]["containers"][0]["image"] == want
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] is True
        image_ids.add(status["imageID"])
    # kubelet reports the repository digest containerd resolved: the index the chart pins, by the mirror's name
    assert image_ids == {f"{installed.registry.address}/{release.NAME}@{made['index_digest']}"}
    host = installed.cluster.host(installed.cluster.names[0])
    content = {line.split()[0] for line in host.ctr("content", "ls").stdout.splitlines()[1:] if line.strip()}
    assert made["index_digest"] in content
    assert made["digests"]["amd64"] in content  # this node's architecture's image was fetched
    assert made["digests"]["arm64"] not in content  # and only it
    MEASURED.append(f"replicas' imageID {image_ids.pop()}; the node fetched linux/amd64 {made['digests']['amd64']}")


def test_slice_pod_is_mutated_through_the_service(installed: Published) -> None:
    c = installed.cluster
    c.kubectl("create", "namespace", "team-release")
    try:
        pod = json.loads(c.kubectl("create", "-n", "team-release", "-f", "-", "-o", "json",
                                   input=json.dumps(SLICE_POD)).stdout)
        assert pod["spec"]["schedulerName"] == "hami-scheduler"
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
    finally:
        c.kubectl("delete", "pod", "slice", "-n", "team-release", "--grace-period=0", "--force", check=False)
        c.kubectl("delete", "namespace", "team-release", "--wait=false", check=False)


def test_image_and_chart_verify_with_the_key(published: Published) -> None:
    made = published.made
    pub = published.dist / "cosign.pub"
    for ref in (f"{published.registry.local}/{release.NAME}@{made['index_digest']}",
                *(f"{published.registry.local}/{release.NAME}@{d}" for d in made["digests"].values()),
                f"{made['chart']}@{made['chart_digest']}"):
        done = published.cosign("verify", "--key", str(pub), "--insecure-ignore-tlog", ref)
        payload = json.loads(done.stdout)
        assert payload[0]["critical"]["image"]["docker-manifest-digest"] == ref.rsplit("@", 1)[1]


def test_verification_fails_with_another_key(published: Published) -> None:
    made = published.made
    other = published.other_key.with_suffix(".pub")
    ref = f"{published.registry.local}/{release.NAME}@{made['index_digest']}"
    done = published.cosign("verify", "--key", str(other), "--insecure-ignore-tlog", ref, check=False)
    assert done.returncode != 0
    assert "no matching signatures" in done.stderr


def test_an_image_pushed_later_under_the_tag_fails_verification(published: Published) -> None:
    """Someone pushes another image under the release's tag: verifying the tag no longer passes."""
    made = published.made
    tag = f"{published.registry.local}/{release.NAME}:{made['version']}-retagged"
    signed = f"{published.registry.local}/{release.NAME}:{made['version']}"
    pub = str(published.dist / "cosign.pub")
    published.cosign("verify", "--key", pub, "--insecure-ignore-tlog", signed)  # passes before
    # the pause image, under a tag of the release's repository (a later tag, so the other tests are unaffected)
    image.run("push", "--tls-verify=false", published.cluster.pause, f"docker://{tag}")
    image.run("push", "--tls-verify=false", published.cluster.pause, f"docker://{signed}")
    try:
        done = published.cosign("verify", "--key", pub, "--insecure-ignore-tlog", signed, check=False)
        assert done.returncode != 0
        assert "no signatures found" in done.stderr or "no matching signatures" in done.stderr
    finally:  # the release's tag back on its index, for whatever runs after
        subprocess.run(["skopeo", "copy", "--all", "--preserve-digests", "--src-tls-verify=false",
                        "--dest-tls-verify=false",
                        f"docker://{published.registry.local}/{release.NAME}@{made['index_digest']}",
                        f"docker://{signed}"], check=True, capture_output=True, timeout=300)


def attested_sbom(published: Published, arch: str) -> dict[str, Any]:
    ref = f"{published.registry.local}/{release.NAME}@{published.made['digests'][arch]}"
    done = published.cosign("verify-attestation", "--key", str(published.dist / "cosign.pub"),
                            "--insecure-ignore-tlog", "--type", "cyclonedx", ref)
    envelope = json.loads(done.stdout.splitlines()[0])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["subject"][0]["digest"]["sha256"] == published.made["digests"][arch].split(":")[1]
    predicate: dict[str, Any] = statement["predicate"]
    return predicate


def locked_versions() -> dict[str, str]:
    """Name → version of every runtime dependency pinned in pyproject.toml."""
    import tomllib
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {d.split("==")[0].lower(): d.split("==")[1] for d in deps}


def test_sbom_attestation_names_python_and_debian_packages(published: Published) -> None:
    pins = locked_versions()
    for arch in release.ARCHITECTURES:
        sbom = attested_sbom(published, arch)
        components = sbom["components"]
        python = {c["name"].lower(): c["version"] for c in components if c.get("purl", "").startswith("pkg:pypi/")}
        for name in ("kopf", "aiohttp", "cryptography", "orjson"):
            assert python.get(name) == pins[name], (arch, name, python.get(name))
        assert "kubernetes" not in python  # doctor's extra, not in the image
        assert "pip" not in python and "setuptools" not in python
        debian = {c["name"]: c["version"] for c in components if c.get("purl", "").startswith("pkg:deb/debian/")}
        python311 = {n: v for n, v in debian.items() if n.startswith("python3.11")}
        assert python311 and all(v.startswith("3.11.") for v in python311.values()), (arch, python311)
        assert all(f"arch={arch}" in c["purl"] for c in components if c.get("purl", "").startswith("pkg:deb/")
                   and "arch=all" not in c["purl"])
        MEASURED.append(f"SBOM linux/{arch}: {len(python)} Python packages, {len(debian)} Debian packages")


def test_offline_bundle(published: Published) -> None:
    dist, made = published.dist, published.made
    sums = (dist / "SHA256SUMS").read_text().splitlines()
    listed = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in sums}
    assert sorted(listed) == sorted(made["files"])
    for name, digest in listed.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name
    published.cosign("verify-blob", "--key", str(dist / "cosign.pub"), "--insecure-ignore-tlog",
                     "--signature", str(dist / "SHA256SUMS.sig"), str(dist / "SHA256SUMS"))
    tampered = dist.parent / "SHA256SUMS.tampered"
    tampered.write_text("".join(line + "\n" for line in sums[1:]))
    assert published.cosign("verify-blob", "--key", str(dist / "cosign.pub"), "--insecure-ignore-tlog",
                            "--signature", str(dist / "SHA256SUMS.sig"), str(tampered), check=False).returncode != 0
    for arch, digest in made["digests"].items():
        archive = dist / f"{release.NAME}-{made['version']}-linux-{arch}.oci.tar"
        assert oci.archive_digest(archive) == digest
    with tarfile.open(dist / f"{release.NAME}-{made['version']}.tgz") as tar:
        member = tar.extractfile(f"{release.NAME}/values.yaml")
        assert member is not None
        values = yaml.safe_load(member)
        member = tar.extractfile(f"{release.NAME}/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member)
    assert values["image"]["digest"] == made["index_digest"]
    assert values["image"]["registry"] == published.registry.local
    assert chart["version"] == chart["appVersion"] == made["version"]
    notes = (dist / "RELEASE-NOTES.md").read_text()
    assert made["index_digest"] in notes and made["chart_digest"] in notes
    assert "cosign verify --key cosign.pub" in notes


def test_python_package_is_summed_and_signed(published: Published) -> None:
    """The wheels and the sdist in dist/, in SHA256SUMS, each signature verifying with the release's key only."""
    dist, made = published.dist, published.made
    names = made["python"]
    version = made["version"].split("-")[0]
    assert len(names) == 3
    assert any(n.endswith("-py3-none-any.whl") for n in names)
    assert any(n.endswith("_x86_64.whl") and "-cp3" in n for n in names)
    assert f"hami_mt_webhook-{version}.tar.gz" in names
    listed = {name: digest for digest, name in (line.split("  ", 1)
                                                for line in (dist / "SHA256SUMS").read_text().splitlines())}
    for name in names:
        for listed_name in (name, f"{name}.sig"):
            assert hashlib.sha256((dist / listed_name).read_bytes()).hexdigest() == listed[listed_name], listed_name
        blob = ["verify-blob", "--insecure-ignore-tlog", "--signature", str(dist / f"{name}.sig"), str(dist / name)]
        published.cosign(blob[0], "--key", str(dist / "cosign.pub"), *blob[1:])
        other = published.other_key.with_suffix(".pub")
        assert published.cosign(blob[0], "--key", str(other), *blob[1:], check=False).returncode != 0, name


def test_wheel_installs_with_the_doctor_extra(published: Published, tmp_path: Path) -> None:
    """The pure wheel as the README says to install it: into a clean virtualenv with [doctor], `doctor --help`
    answering. The compiled one carries the rules as extension modules (the e2e tier runs a wheel built so)."""
    names = published.made["python"]
    (pure,) = (n for n in names if n.endswith("-py3-none-any.whl"))
    (compiled,) = (n for n in names if "-cp3" in n)
    assert not any(f.endswith(".so") for f in wheel.contents(published.dist / pure))
    assert any(f.startswith("hami_mt_webhook/rules/pods.") and f.endswith(".so")
               for f in wheel.contents(published.dist / compiled))
    python = wheel.bare_python(tmp_path / "venv")
    started = time.monotonic()
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"{published.dist / pure}[doctor]"], check=True, capture_output=True, timeout=600)
    MEASURED.append(f"pip install {pure}[doctor] into a clean virtualenv: {time.monotonic() - started:.0f} s")
    done = subprocess.run([str(tmp_path / "venv" / "bin" / "hami-mt-webhook"), "doctor", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--kubeconfig" in done.stdout


def test_arm64_image_reviews_examples_as_amd64_does(published: Published) -> None:
    """The arm64 image, run under qemu, gives the amd64 image's answers on the examples, its rules compiled."""
    made = published.made
    examples = sorted(p for p in (REPO_ROOT / "examples").glob("*.yaml") if p.name != "nodes.yaml")
    assert examples
    outputs = {}
    for arch in release.ARCHITECTURES:
        archive = published.dist / f"{release.NAME}-{made['version']}-linux-{arch}.oci.tar"
        outputs[arch] = oci.review_in_archive(archive, arch, examples, REPO_ROOT / "examples" / "nodes.yaml")
    assert outputs["amd64"].exit_code == outputs["arm64"].exit_code == 1  # the examples include denials
    answers = {arch: [json.loads(line) for line in out.review.splitlines()] for arch, out in outputs.items()}
    assert answers["arm64"] == answers["amd64"]
    assert len(answers["amd64"]) >= len(examples)
    assert {a["allowed"] for a in answers["amd64"]} == {True, False}
    assert outputs["arm64"].compiled and outputs["amd64"].compiled
    assert outputs["arm64"].machine == "aarch64" and outputs["amd64"].machine == "x86_64"
    MEASURED.append(f"arm64 review of {len(examples)} examples under qemu: {outputs['arm64'].seconds:.1f} s "
                    f"(amd64 {outputs['amd64'].seconds:.1f} s), compiled rules: {outputs['arm64'].compiled}")


def test_sizes_within_target(published: Published) -> None:
    sizes = published.made["sizes_mb"]
    assert sizes["amd64"] <= 150, sizes
    assert sizes["arm64"] <= 150, sizes




def test_images_carry_the_oci_labels(published: Published) -> None:
    made = published.made
    for arch, digest in made["digests"].items():
        config = json.loads(subprocess.run(
            ["skopeo", "inspect", "--config", "--tls-verify=false",
             f"docker://{published.registry.local}/{release.NAME}@{digest}"],
            capture_output=True, text=True, check=True, timeout=60).stdout)
        assert config["architecture"] == arch and config["os"] == "linux"
        labels = config["config"]["Labels"]
        assert labels["org.opencontainers.image.revision"] == made["revision"]
        assert labels["org.opencontainers.image.version"] == made["version"]
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert labels["org.opencontainers.image.source"]
        assert config["config"]["User"] == "65532:65532"
