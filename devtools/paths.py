"""Where the tooling finds the repository's own files: one home for each path, whatever module or test needs it."""

from __future__ import annotations

from pathlib import Path

#: The repository's root: this file is devtools/paths.py.
REPO_ROOT = Path(__file__).resolve().parent.parent
#: The chart, the one home of the shipped alerts and dashboard too.
CHART = REPO_ROOT / "charts" / "hami-mt-webhook"
CHANGELOG = REPO_ROOT / "CHANGELOG.md"
#: The kustomize base and its components.
MANIFESTS = REPO_ROOT / "manifests"
