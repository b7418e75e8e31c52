"""Where the tooling finds the repository's own files: one home for each path, whatever module or test needs it."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository's root: this file is devtools/paths.py.
REPO_ROOT = Path(__file__).resolve().parent.parent
#: The chart, the one home of the shipped alerts and dashboard too.
CHART = REPO_ROOT / "charts" / "hami-mt-webhook"
CHANGELOG = REPO_ROOT / "CHANGELOG.md"
#: The kustomize base and its components.
MANIFESTS = REPO_ROOT / "manifests"
#: Where every build is cached, outside the work tree, keyed by version: the scripts/build-*.sh read the same
#: `$HAMI_MT_CACHE`, else `$XDG_CACHE_HOME/hami-mt-webhook`, else ~/.cache/hami-mt-webhook.
CACHE = Path(os.environ.get("HAMI_MT_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hami-mt-webhook")
#: `make run`'s and `controlplane up`'s state: one directory per run beneath it.
RUN_DIR = CACHE / "run"
