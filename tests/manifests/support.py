"""What the tests of the kustomize base share: its names, its webhook registrations, and readers of its
documents (the CEL expressions among them). The documents are the `docs` fixture (tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import manifests

NS = "hami-mt-webhook"
NAME = "hami-mt-webhook"
SLICES = ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core")
WHOLE = "mthreads.com/gpu"
HOOKS = {
    "MutatingWebhookConfiguration": ("mutate.hami-mt.mthreads.com", "/mutate-pods"),
    "ValidatingWebhookConfiguration": ("validate.hami-mt.mthreads.com", "/validate-pods"),
}
WORKLOADS = "hami-mt-webhook-workloads"
BACKSTOP = "hami-mt-backstop"
#: SPEC 4.6: the annotation guard, a policy in the base (components/guard-webhook: a webhook).
GUARD = "hami-mt-annotation-guard"
WARN = "hami-mt-webhook-warn"
TRAINING = ("validate-training.hami-mt.mthreads.com", "/validate-workloads")
#: Every webhook configuration, (kind, metadata.name) -> [(webhook name, handler path), ...].
CONFIGS = {
    **{(kind, NAME): [hook] for kind, hook in HOOKS.items()},
    ("ValidatingWebhookConfiguration", WORKLOADS): [
        ("validate-workloads.hami-mt.mthreads.com", "/validate-workloads"), TRAINING],
    # SPEC 4.10: the same registrations for namespaces in rollout mode, under /warn/
    ("MutatingWebhookConfiguration", WARN): [("mutate-warn.hami-mt.mthreads.com", "/warn/mutate-pods")],
    ("ValidatingWebhookConfiguration", WARN): [
        ("validate-warn.hami-mt.mthreads.com", "/warn/validate-pods"),
        ("validate-workloads-warn.hami-mt.mthreads.com", "/warn/validate-workloads"),
        ("validate-training-warn.hami-mt.mthreads.com", "/warn/validate-workloads")],
}
CA_PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH")


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def configuration(docs: list[dict[str, Any]], kind: str, name: str = NAME) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def kustomize(path: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """`kubectl kustomize` of an overlay of the base with `components` (names under manifests/components)."""
    shutil.copytree(manifests.base_dir(), tmp_path / "base")
    (tmp_path / "overlay").mkdir()
    listed = ", ".join(f"../base/components/{c}" for c in components)
    (tmp_path / "overlay" / "kustomization.yaml").write_text(f"resources: [../base]\ncomponents: [{listed}]\n")
    return kustomize(tmp_path / "overlay")


def match_condition(docs: list[dict[str, Any]]) -> str:
    """The one matchConditions expression; the two webhooks and the backstop must share it."""
    texts = {c["expression"] for d in docs if d["kind"] in HOOKS and d["metadata"]["name"] == NAME
             for w in d["webhooks"] for c in w["matchConditions"] if c["name"] == "names-slice-resource"}
    backstop = configuration(docs, "ValidatingAdmissionPolicy", BACKSTOP)
    texts |= {c["expression"] for c in backstop["spec"]["matchConditions"]}
    assert len(texts) == 1, texts
    return texts.pop()


def workload_condition(docs: list[dict[str, Any]], index: int = 0) -> str:
    hook = configuration(docs, "ValidatingWebhookConfiguration", WORKLOADS)["webhooks"][index]
    (condition,) = hook["matchConditions"]
    assert condition["name"]
    return condition["expression"]
