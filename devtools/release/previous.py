"""The previous release, built from its git revision as a release builds it: what an upgrade starts from.

The node tier installs its chart and image, then upgrades to this tree's (`tests/node/conftest.chart`). The
revision is exported with `git archive` (its tracked files only, nothing of this work tree) into the cache
outside the tree, keyed by the revision, and its image built from its own Dockerfile and sources by
`devtools.builds.image.build` (the same bases, stand-ins or official). Both are kept, so a second run only looks
them up. The image is tagged `rev-<revision>` rather than with its version, which this tree may still share
until its own release: two builds of one tag would replace each other in the node's containerd.

    python -m devtools.release.previous [--bases auto|standin|pull]

prints the chart's directory and the image's name.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devtools import paths
from devtools.builds import image
from devtools.paths import REPO_ROOT

#: Each previous release's tree, by revision.
CACHE = paths.CACHE / "previous"

__all__ = ["RELEASE", "Previous", "PreviousError", "build", "fetch_commit"]


@dataclass(frozen=True)
class Previous:
    """A release: its version and the commit it was made from (CHANGELOG.md's section of the version)."""

    version: str
    revision: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{40}", self.revision):
            raise PreviousError(f"revision {self.revision!r}: a full commit id (40 hex digits) is needed")

    @property
    def tag(self) -> str:
        return f"rev-{self.revision[:12]}"

    @property
    def image(self) -> str:
        """The image's name in local storage and in the node's containerd."""
        return image.reference(self.tag)

    @property
    def tree(self) -> Path:
        """Where the revision's files are kept."""
        return CACHE / self.revision

    @property
    def chart(self) -> Path:
        return self.tree / "charts" / "hami-mt-webhook"


#: The release before this tree's: 0.1.0 (CHANGELOG.md), the only one so far. Clones carry no tag, so the
#: commit is named.
RELEASE = Previous("0.1.0", "793e57e61339f5eefc28f0341c12bff4d7f7663d")


class PreviousError(RuntimeError):
    """The revision is not in this clone, or its build failed; the message says which."""


def export(rel: Previous) -> Path:
    """The revision's tracked files in the cache (made once, atomically: a half-written tree is never used)."""
    if (rel.tree / "Dockerfile").is_file():
        return rel.tree
    fetch_commit(rel)
    rel.tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=rel.tree.parent) as tmp:
        archive = Path(tmp) / "tree.tar"
        subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), rel.revision], cwd=REPO_ROOT,
                       check=True, capture_output=True)
        unpacked = Path(tmp) / "tree"
        unpacked.mkdir()
        shutil.unpack_archive(archive, unpacked, filter="data")
        os.replace(unpacked, rel.tree)
    return rel.tree


def fetch_commit(rel: Previous) -> None:
    """The release's commit in this clone: a shallow clone (CI's, often) lacks it, and asks its origin for
    that one commit."""
    if _has_commit(rel.revision):
        return
    fetched = subprocess.run(["git", "fetch", "--quiet", "--no-tags", "--depth=1", "origin", rel.revision],
                             cwd=REPO_ROOT, capture_output=True, text=True)
    if not _has_commit(rel.revision):
        raise PreviousError(f"commit {rel.revision} (release {rel.version}) is not in this clone, and "
                            f"fetching it from origin failed ({fetched.stderr.strip()[-200:] or 'no origin'}): "
                            "`git fetch --unshallow` (or a full clone) brings it")


def _has_commit(revision: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{revision}^{{commit}}"], cwd=REPO_ROOT,
                          capture_output=True).returncode == 0


def build(rel: Previous = RELEASE, mode: str = "auto", say: Callable[[str], None] = print) -> Previous:
    """The release's chart (`rel.chart`) and amd64 image (`rel.image`), made unless already there."""
    tree = export(rel)
    if image.exists(rel.image):
        labels = image.run("image", "inspect", "--format",
                           '{{index .Labels "org.opencontainers.image.revision"}}', rel.image).stdout.strip()
        if labels == rel.revision:
            return rel
    try:
        image.build(mode, rel.tag, say, labels={"org.opencontainers.image.revision": rel.revision,
                                                "org.opencontainers.image.version": rel.version}, context=tree)
    except image.ImageError as e:
        raise PreviousError(f"the image of {rel.version} ({rel.revision[:12]}) did not build: {e}") from e
    return rel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.release.previous", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bases", choices=["auto", "standin", "pull"], default="auto",
                        help="where the image's bases come from, as `make image` (IMAGE_BASES)")
    args = parser.parse_args(argv)
    try:
        rel = build(mode=args.bases, say=lambda line: print(line, file=sys.stderr))
    except (PreviousError, image.ImageError) as e:
        print(f"previous release: {e}", file=sys.stderr)
        return 1
    print(rel.chart)
    print(rel.image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
