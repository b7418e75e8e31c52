"""`make release`: the image for linux/amd64 and linux/arm64 under one index, the chart as an OCI artifact
pinned to that index by digest, cosign signatures made with a key on both, each image's SBOM attached as a
signed attestation, and `dist/`, the offline bundle, all from one command:

    python -m devtools.release --registry HOST[:PORT][/PATH] --key cosign.key [--version X.Y.Z]
                               [--plain-http] [--dist dist] [--bases auto|standin|pull] [--source URL]

Nothing here contacts a transparency log or a public registry: signatures are made and checked by key
(`--tlog-upload=false`, `--insecure-ignore-tlog`), and the only registry is the one named. `--plain-http`
is for a registry without TLS (a test registry, a lab mirror). The key's password comes from
`$COSIGN_PASSWORD`, as cosign reads it. Credentials for a registry that needs them come from the tools' own
logins (`podman login`, `helm registry login`, `cosign login`), as the release workflow does.

What `dist/` holds, and what the release notes say to check first:
    hami-mt-webhook-X.Y.Z.tgz                   the chart, its default image pinned by the index's digest
    hami-mt-webhook-X.Y.Z-linux-<arch>.oci.tar  each architecture's image (an OCI archive, digest kept)
    hami-mt-webhook-X.Y.Z-linux-<arch>.cdx.json each image's SBOM (CycloneDX), as attested
    hami_mt_webhook-X.Y.Z-*.whl, .tar.gz       the Python package (`pip install '<wheel>[doctor]'`): the
                                                wheel with compiled rules for this machine's CPython, a
                                                pure py3-none-any one for any other, the sdist; each with
                                                cosign's signature beside it (`<file>.sig`)
    release.json                                registry, version, digests: what the tests read
    RELEASE-NOTES.md                            CHANGELOG.md's section, the digests, how to verify
    cosign.pub                                  the key that verifies everything above
    SHA256SUMS, SHA256SUMS.sig                  every file above, and cosign's signature of that list
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devtools.builds import image, oci, wheel
from devtools.builds.binaries import helm
from devtools.paths import CHANGELOG, CHART, REPO_ROOT
from devtools.release import changelog
from hami_mt_webhook import __version__

TOOLS_SCRIPT = REPO_ROOT / "scripts" / "build-release-tools.sh"
NAME = "hami-mt-webhook"
#: The architectures of every release, as OCI platforms name them.
ARCHITECTURES = ("amd64", "arm64")
#: Where the chart goes under the registry: oci://<registry>/charts/hami-mt-webhook.
CHART_PATH = "charts"
LICENSE = "Apache-2.0"
REGISTRY = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9._-]+)*$")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ReleaseError(RuntimeError):
    """A step failed or an input is wrong; the message names which, and what the user typed."""


@dataclass
class Release:
    """What was published, by digest: `dist/release.json`."""

    version: str
    registry: str
    revision: str
    image: str = ""
    index_digest: str = ""
    digests: dict[str, str] = field(default_factory=dict)
    chart: str = ""
    chart_digest: str = ""
    sizes_mb: dict[str, float] = field(default_factory=dict)
    python: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def ref(self, digest: str) -> str:
        return f"{self.image}@{digest}"


# inputs --------------------------------------------------------------------------------------------------

def check_registry(registry: str) -> str:
    """host[:port][/path], lower case, no scheme, no trailing slash, as image references take it."""
    if not REGISTRY.match(registry):
        raise ReleaseError(f"REGISTRY={registry!r} is not host[:port][/path] (e.g. registry.example:5000/hami; "
                           "no scheme, no trailing slash, lower case)")
    return registry


def check_version(version: str, package: str = __version__, notes: str | None = None) -> str:
    """The version to release: the package's own (one version for the wheel, the image and the chart),
    or a pre-release of it (`0.2.0-rc.1`); CHANGELOG.md must have its section."""
    if version != package and not version.startswith(package + "-"):
        raise ReleaseError(f"VERSION={version!r} is not the package's version {package} (nor a pre-release of "
                           "it, X.Y.Z-suffix): set it in pyproject.toml and hami_mt_webhook/__init__.py first")
    text = notes if notes is not None else CHANGELOG.read_text()
    try:
        changelog.section(text, package)
    except changelog.ChangelogError as e:
        raise ReleaseError(f"CHANGELOG.md: {e}") from e
    return version


def check_key(key: str | None) -> Path:
    if not key:
        raise ReleaseError("no signing key: give COSIGN_KEY=<cosign.key> (`cosign generate-key-pair` makes one; "
                           "its password in $COSIGN_PASSWORD)")
    path = Path(key)
    if not path.is_file():
        raise ReleaseError(f"COSIGN_KEY={key!r}: no such file")
    return path


def revision() -> str:
    """The commit released, `-dirty` when the tree has changes (the label says so rather than lie)."""
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    if sha.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                           capture_output=True, text=True).stdout.strip()
    return sha.stdout.strip() + ("-dirty" if dirty else "")


# tools ---------------------------------------------------------------------------------------------------

def release_tools() -> Path:
    """cosign, syft and actionlint, built once into a versioned cache (scripts/build-release-tools.sh)."""
    done = subprocess.run(["bash", str(TOOLS_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise ReleaseError(f"{TOOLS_SCRIPT.name} failed with exit status {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Tools:
    """The commands a release runs, and how they reach the registry."""

    bin_dir: Path
    helm_bin: Path
    plain_http: bool = False
    say: Callable[[str], None] = print
    env: dict[str, str] = field(default_factory=lambda: {
        **os.environ, "COSIGN_PASSWORD": os.environ.get("COSIGN_PASSWORD", ""),
        "SYFT_CHECK_FOR_APP_UPDATE": "false", "COSIGN_EXPERIMENTAL": "0"})

    def run(self, *cmd: str, timeout: float = 900) -> str:
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise ReleaseError(f"{' '.join(cmd[:3])} ... exited with {done.returncode}:\n"
                               f"{done.stdout[-1500:]}{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def cosign(self, *args: str, registry: bool = True) -> str:
        """cosign `args`; a verb that talks to the registry is told when that is plain HTTP."""
        http = ["--allow-http-registry"] if self.plain_http and registry else []
        return self.run(str(self.bin_dir / "cosign"), *args[:1], *http, *args[1:])

    def cosign_offline(self, verb: str, key: Path, ref: str, *args: str) -> str:
        """`cosign sign|attest` by key, nothing sent to a transparency log."""
        return self.cosign(verb, "--key", str(key), "--tlog-upload=false", "--yes", *args, ref)

    def helm(self, *args: str) -> str:
        http = ["--plain-http"] if self.plain_http else []
        return self.run(str(self.helm_bin), *args, *http)

    def skopeo(self, *args: str) -> str:
        return self.run("skopeo", *args)

    @property
    def tls(self) -> str:
        return f"--tls-verify={'false' if self.plain_http else 'true'}"


# steps ---------------------------------------------------------------------------------------------------

def build_images(rel: Release, bases: str, source: str, say: Callable[[str], None]) -> dict[str, str]:
    """One image per architecture from the Dockerfile, labelled as OCI says; their local names."""
    labels = {"org.opencontainers.image.source": source, "org.opencontainers.image.revision": rel.revision,
              "org.opencontainers.image.version": rel.version, "org.opencontainers.image.licenses": LICENSE,
              "org.opencontainers.image.title": NAME}
    built = {}
    for arch in ARCHITECTURES:
        name = image.build(bases, say=say, platform=f"linux/{arch}", labels=labels)
        rel.sizes_mb[arch] = round(image.size_mb(name), 1)
        built[arch] = name
    return built


def push_index(rel: Release, built: Mapping[str, str], tools: Tools) -> None:
    """The architectures' images under one OCI index, pushed by tag; the index's and each image's digest."""
    target = f"{rel.image}:{rel.version}"
    index = f"localhost/{NAME}-index:{rel.version}"
    image.run("manifest", "rm", index, check=False)
    image.run("manifest", "create", index)
    for arch in ARCHITECTURES:
        image.run("manifest", "add", "--arch", arch, "--os", "linux", index, f"containers-storage:{built[arch]}")
    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        image.run("manifest", "push", "--all", "--format", "oci", "--digestfile", str(digest_file), tools.tls,
                  index, f"docker://{target}")
        rel.index_digest = digest_file.read_text().strip()
    image.run("manifest", "rm", index, check=False)
    raw = json.loads(tools.skopeo("inspect", "--raw", tools.tls, f"docker://{rel.ref(rel.index_digest)}"))
    rel.digests = {m["platform"]["architecture"]: m["digest"] for m in raw["manifests"]}
    if sorted(rel.digests) != sorted(ARCHITECTURES):
        raise ReleaseError(f"the pushed index holds {sorted(rel.digests)}, not {list(ARCHITECTURES)}")


def export_archives(rel: Release, dist: Path, tools: Tools) -> dict[str, Path]:
    """Each architecture's image as pushed, into an OCI archive: the same manifest, so the same digest, for
    `skopeo copy oci-archive:… docker://<mirror>/hami-mt-webhook:X.Y.Z` where no registry is reachable."""
    archives = {}
    for arch, digest in rel.digests.items():
        path = dist / f"{NAME}-{rel.version}-linux-{arch}.oci.tar"
        path.unlink(missing_ok=True)
        tools.skopeo("copy", "--quiet", "--preserve-digests", f"--src-{tools.tls[2:]}",
                     f"docker://{rel.ref(digest)}", f"oci-archive:{path}:{NAME}:{rel.version}")
        if oci.archive_digest(path) != digest:
            raise ReleaseError(f"{path.name} holds {oci.archive_digest(path)}, not the pushed {digest}")
        archives[arch] = path
    return archives


def make_sboms(rel: Release, archives: Mapping[str, Path], dist: Path, tools: Tools) -> dict[str, Path]:
    """Each image's SBOM, its Debian and Python packages, as syft reads them from the archive."""
    sboms = {}
    for arch, archive in archives.items():
        path = dist / f"{NAME}-{rel.version}-linux-{arch}.cdx.json"
        tools.run(str(tools.bin_dir / "syft"), "scan", f"oci-archive:{archive}", "--quiet",
                  "--source-name", NAME, "--source-version", rel.version, "-o", f"cyclonedx-json={path}")
        sboms[arch] = path
    return sboms


def pinned_values(values: str, registry: str, digest: str) -> str:
    """The chart's values.yaml with its image's registry and digest set, comments kept."""
    out, n = re.subn(r"(?m)^(image:\n(?:  .*\n|\s*#.*\n)*?  registry: )\"\"", rf'\g<1>"{registry}"', values)
    out, m = re.subn(r"(?m)^(image:\n(?:  .*\n|\s*#.*\n)*?  digest: )\"\"", rf'\g<1>"{digest}"', out)
    if n != 1 or m != 1:
        raise ReleaseError("the chart's values.yaml has no empty image.registry and image.digest to set")
    return out


def package_chart(rel: Release, dist: Path, tools: Tools) -> Path:
    """The chart at the release's version, its default image this release's index by digest."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / NAME
        shutil.copytree(CHART, chart)
        values = chart / "values.yaml"
        values.write_text(pinned_values(values.read_text(), rel.registry, rel.index_digest))
        tools.run(str(tools.helm_bin), "lint", "--strict", str(chart))
        tools.run(str(tools.helm_bin), "package", str(chart), "--version", rel.version,
                  "--app-version", rel.version, "--destination", str(dist))
    return dist / f"{NAME}-{rel.version}.tgz"


def push_chart(rel: Release, package: Path, tools: Tools) -> None:
    out = tools.helm("push", str(package), f"oci://{rel.registry}/{CHART_PATH}")
    found = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", out)
    if not found:
        raise ReleaseError(f"helm push printed no digest:\n{out}")
    rel.chart = f"{rel.registry}/{CHART_PATH}/{NAME}"
    rel.chart_digest = found[1]


def sign(rel: Release, key: Path, sboms: Mapping[str, Path], tools: Tools) -> None:
    """The index and every image in it, and the chart, signed; each image's SBOM attested on its digest."""
    tools.cosign_offline("sign", key, rel.ref(rel.index_digest), "--recursive")
    tools.cosign_offline("sign", key, f"{rel.chart}@{rel.chart_digest}")
    for arch, sbom in sboms.items():
        tools.cosign_offline("attest", key, rel.ref(rel.digests[arch]), "--type", "cyclonedx",
                             "--predicate", str(sbom))


def package_python(rel: Release, dist: Path, key: Path, tools: Tools) -> list[Path]:
    """The Python package as users build it (pip and `python -m build`, each in a virtualenv holding nothing
    else): the wheel with the rules compiled, a pure one for other platforms, and the sdist; each signed by
    key, its signature `<file>.sig` beside it."""
    built = [wheel.build(dist), wheel.build(dist, pure=True), wheel.build_sdist(dist)]
    for path in built:
        tools.cosign("sign-blob", "--key", str(key), "--tlog-upload=false", "--yes", "--output-signature",
                     f"{path}.sig", str(path), registry=False)
    rel.python = [p.name for p in built]
    return built


def notes(rel: Release, section: str) -> str:
    """The release notes: CHANGELOG.md's section, then what was published and how to check it."""
    image_ref = rel.ref(rel.index_digest)
    lines = [f"# hami-mt-webhook {rel.version}", "", section.strip(), "", "## Published", "",
             f"- Image (linux/amd64, linux/arm64): `{image_ref}`"]
    lines += [f"  - linux/{arch}: `{d}` ({rel.sizes_mb.get(arch, 0):.0f} MB uncompressed)"
              for arch, d in sorted(rel.digests.items())]
    lines += [f"- Chart: `oci://{rel.chart}` version `{rel.version}` (`{rel.chart_digest}`)",
              f"- Commit: `{rel.revision}`", "", "## Verify, then install", "", "```sh",
              f"cosign verify --key cosign.pub --insecure-ignore-tlog {image_ref}",
              f"cosign verify --key cosign.pub --insecure-ignore-tlog {rel.chart}@{rel.chart_digest}",
              f"cosign verify-attestation --key cosign.pub --insecure-ignore-tlog --type cyclonedx "
              f"{rel.ref(rel.digests.get('amd64', rel.index_digest))}",
              f"helm install hami-mt-webhook oci://{rel.chart} --version {rel.version} "
              "-n hami-mt-webhook  # --set image.registry=<mirror> when mirrored",
              "```", "", "Offline: `sha256sum -c SHA256SUMS` and `cosign verify-blob --key cosign.pub "
              "--insecure-ignore-tlog --signature SHA256SUMS.sig SHA256SUMS`, then per architecture "
              f"`skopeo copy --preserve-digests oci-archive:{NAME}-{rel.version}-linux-<arch>.oci.tar "
              f"docker://<mirror>/{NAME}:{rel.version}` and install the chart with "
              "`--set image.registry=<mirror> --set image.digest=<that architecture's digest>`.", ""]
    if rel.python:
        lines += ["## The command line (`doctor`, `review`, `certs`)", "",
                  "```sh", f"cosign verify-blob --key cosign.pub --insecure-ignore-tlog "
                  f"--signature {rel.python[0]}.sig {rel.python[0]}",
                  f"pip install '{rel.python[0]}[doctor]'  # pip picks the wheel this machine can run", "```",
                  "", "Files: " + ", ".join(f"`{name}`" for name in rel.python) + ".", ""]
    return "\n".join(lines)


def sha256sums(dist: Path, names: Sequence[str]) -> str:
    out = []
    for name in sorted(names):
        h = hashlib.sha256()
        with open(dist / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out.append(f"{h.hexdigest()}  {name}\n")
    return "".join(out)


def finish_dist(rel: Release, dist: Path, key: Path, tools: Tools) -> None:
    """release.json, the notes, the public key, SHA256SUMS and its signature."""
    (dist / "cosign.pub").write_text(tools.cosign("public-key", "--key", str(key), registry=False))
    (dist / "RELEASE-NOTES.md").write_text(notes(rel, changelog.section(CHANGELOG.read_text(),
                                                                         rel.version.split("-")[0])))
    rel.files = sorted(p.name for p in dist.iterdir() if p.is_file() and not p.name.startswith("SHA256SUMS"))
    rel.files.append("release.json")
    (dist / "release.json").write_text(json.dumps(asdict(rel), indent=2) + "\n")
    (dist / "SHA256SUMS").write_text(sha256sums(dist, rel.files))
    tools.cosign("sign-blob", "--key", str(key), "--tlog-upload=false", "--yes", "--output-signature",
                 str(dist / "SHA256SUMS.sig"), str(dist / "SHA256SUMS"), registry=False)


def release(registry: str, key: str | None, version: str = __version__, dist: Path = REPO_ROOT / "dist",
            plain_http: bool = False, bases: str = "auto", source: str = "",
            say: Callable[[str], None] = print) -> Release:
    """Everything `make release` does, in order; the digests published."""
    check_registry(registry)
    check_version(version)
    key_path = check_key(key)
    rel = Release(version=version, registry=registry, revision=revision(), image=f"{registry}/{NAME}")
    tools = Tools(release_tools(), helm(), plain_http, say)
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    say(f"building {NAME} {version} for {', '.join(ARCHITECTURES)}")
    built = build_images(rel, bases, source or NAME, say)
    push_index(rel, built, tools)
    say(f"pushed {rel.ref(rel.index_digest)}")
    archives = export_archives(rel, dist, tools)
    sboms = make_sboms(rel, archives, dist, tools)
    push_chart(rel, package_chart(rel, dist, tools), tools)
    say(f"pushed oci://{rel.chart}:{version}@{rel.chart_digest}")
    sign(rel, key_path, sboms, tools)
    package_python(rel, dist, key_path, tools)
    say(f"built and signed {', '.join(rel.python)}")
    finish_dist(rel, dist, key_path, tools)
    say(f"signed the index, its images and the chart; SBOMs attested; {dist} ready")
    return rel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", required=True, help="host[:port][/path] to push the image and chart to")
    parser.add_argument("--key", default=os.environ.get("COSIGN_KEY"), help="cosign private key (COSIGN_KEY)")
    parser.add_argument("--version", default=__version__, help="default: the package's version")
    parser.add_argument("--dist", type=Path, default=REPO_ROOT / "dist")
    parser.add_argument("--plain-http", action="store_true", help="the registry speaks HTTP, not HTTPS")
    parser.add_argument("--bases", choices=["auto", "standin", "pull"], default="auto",
                        help="where the Dockerfile's bases come from (as `make image`)")
    parser.add_argument("--source", default="", help="org.opencontainers.image.source (the repository's URL)")
    args = parser.parse_args(argv)
    try:
        rel = release(args.registry, args.key, args.version, args.dist, args.plain_http, args.bases,
                      args.source, say=lambda line: print(line, file=sys.stderr))
    except (ReleaseError, image.ImageError, changelog.ChangelogError) as e:
        print(f"make release: {e}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(rel), indent=2))
    return 0

