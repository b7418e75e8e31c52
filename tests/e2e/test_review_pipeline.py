"""`review` at the end of a real pipeline: what `kubectl kustomize` renders goes in whole (SPEC.md §7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from devtools.clusters import manifests
from devtools.clusters.controlplane import binaries

EXE = Path(sys.executable).parent / "hami-mt-webhook"


def test_kustomize_output_pipes_into_review():
    kubectl = binaries() / "kubectl"
    pipeline = f"set -o pipefail; {kubectl} kustomize {manifests.base_dir()} | {EXE} review -f - -o json"
    proc = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    judged = [(x["name"], x["allowed"]) for x in lines if not x.get("skipped")]
    assert judged == [("hami-mt-webhook", True)]  # the webhook's own Deployment; no slices
    skipped = {x["kind"] for x in lines if x.get("skipped")}
    assert {"Namespace", "Service", "ValidatingAdmissionPolicy", "MutatingWebhookConfiguration"} <= skipped
    strict = subprocess.run(["bash", "-c", pipeline + " --strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 2 and strict.stdout == "" and "is not judged (--strict" in strict.stderr
