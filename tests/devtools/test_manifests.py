"""devtools.clusters.manifests reads the kustomize base as kustomize renders it, and writes the overlay that points the
API server at a webhook running as a local process."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import manifests
from tests.manifests.support import CA_PEM, CONFIGS, HOOKS, NAME, configuration, kustomize, needs_kubectl

# --- load -----------------------------------------------------------------------------------------------


def test_load_follows_the_kustomization_resources_in_order(docs: list[dict[str, Any]]) -> None:
    kustomization = yaml.safe_load((manifests.base_dir() / "kustomization.yaml").read_text())
    expected: list[str] = []
    for entry in kustomization["resources"]:
        expected += [d["kind"] for d in yaml.safe_load_all((manifests.base_dir() / entry).read_text()) if d]
    assert [d["kind"] for d in docs] == expected
    assert docs[0]["kind"] == "Namespace"
    assert sorted(d["kind"] for d in docs) == sorted([
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
        "Deployment",
        # the audit's own (audit-rbac.yaml)
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "PodDisruptionBudget", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
        "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicyBinding",
        # the annotation guard (SPEC 4.6): a policy and its two bindings
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding",
    ])  # fmt: skip


def test_load_refuses_kustomizations_it_cannot_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(ValueError, match="namePrefix"):
        manifests.load(tmp_path)


def test_load_follows_nested_directories(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "kustomization.yaml").write_text("resources: [a.yaml]\n")
    (tmp_path / "inner" / "a.yaml").write_text("kind: A\n---\nkind: B\n")
    (tmp_path / "c.yaml").write_text("kind: C\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [inner, c.yaml]\n")
    assert [d["kind"] for d in manifests.load(tmp_path)] == ["A", "B", "C"]


@needs_kubectl
def test_load_reads_what_kustomize_renders(docs: list[dict[str, Any]]) -> None:
    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted(kustomize(manifests.base_dir()), key=key) == sorted(docs, key=key)


# --- local overlay --------------------------------------------------------------------------------------


def test_local_overlay_structure(tmp_path: Path) -> None:
    local = manifests.local_overlay(tmp_path, "https://127.0.0.1:18443/", CA_PEM)
    assert local == tmp_path / "local"
    assert (tmp_path / "base" / "kustomization.yaml").is_file()
    assert not (tmp_path / "base" / "components").exists()
    assert manifests.load(tmp_path / "base") == manifests.load()
    kustomization = yaml.safe_load((local / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../base"]
    by_target = {(p["target"]["kind"], p["target"]["name"]): yaml.safe_load(p["patch"])
                 for p in kustomization["patches"]}
    assert sorted(by_target) == sorted([*CONFIGS, *((kind, NAME) for kind in manifests.IN_CLUSTER_ONLY)])
    for target, hooks in CONFIGS.items():
        for index, (op, (_, path)) in enumerate(zip(by_target[target], hooks, strict=True)):
            assert op["op"] == "replace" and op["path"] == f"/webhooks/{index}/clientConfig"
            assert op["value"]["url"] == f"https://127.0.0.1:18443{path}"
            assert base64.b64decode(op["value"]["caBundle"]) == CA_PEM
    for kind in manifests.IN_CLUSTER_ONLY:
        assert by_target[(kind, NAME)]["$patch"] == "delete"
    # Writing again replaces the copy instead of failing or nesting.
    assert manifests.local_overlay(tmp_path, "https://127.0.0.1:18443", CA_PEM) == local


@needs_kubectl
def test_local_overlay_renders_with_kustomize(tmp_path: Path) -> None:
    rendered = kustomize(manifests.local_overlay(tmp_path, "https://127.0.0.1:18443", CA_PEM))
    kinds = {d["kind"] for d in rendered}
    assert not kinds & set(manifests.IN_CLUSTER_ONLY)
    assert {"Namespace", "ClusterRole", "ValidatingAdmissionPolicy", *HOOKS} <= kinds
    for (kind, name), hooks in CONFIGS.items():
        webhooks = configuration(rendered, kind, name)["webhooks"]
        for hook, (hook_name, path) in zip(webhooks, hooks, strict=True):
            assert hook["clientConfig"] == {
                "url": f"https://127.0.0.1:18443{path}",
                "caBundle": base64.b64encode(CA_PEM).decode(),
            }
            assert hook["failurePolicy"] == ("Ignore" if "workloads" in hook_name or "training" in hook_name
                                             else "Fail") and hook["matchConditions"]
