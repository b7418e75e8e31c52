"""The annotation guard (SPEC 4.6) in the kustomize base: its ValidatingAdmissionPolicy, evaluated as the API
server would, against the server's own rule (hami_mt_webhook.rules.owned), and its webhook component."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from devtools.clusters import manifests
from hami_mt_webhook.admission import review
from hami_mt_webhook.rules import owned
from hami_mt_webhook.rules.config import ANNOTATION_OWNERS, BIND_ANNOTATIONS, Config
from hami_mt_webhook.rules.decision import Denied
from tests.manifests.support import GUARD, NAME, NS, configuration, needs_kubectl, with_components

CONFIG = Config()
TENANT = "system:serviceaccount:team-a:builder"
OWNER = ANNOTATION_OWNERS[0]
GUARD_RULE = {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
              "resources": ["pods", "pods/status"], "scope": "*"}


@pytest.fixture(scope="module")
def cel() -> Any:
    return pytest.importorskip("cel", reason="common-expression-language is not installed")


def pod(**annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}, "status": {"phase": "Pending"}}


def guard(docs: list[dict[str, Any]], cel: Any, operation: str, new: dict[str, Any],
          old: dict[str, Any] | None = None, user: str = TENANT) -> list[str] | None:
    """The policy's answer: None when its matchConditions leave the request alone, else the messages of the
    failed validations (empty: admitted)."""
    spec = configuration(docs, "ValidatingAdmissionPolicy", GUARD)["spec"]
    context: dict[str, Any] = {"object": new, "oldObject": old,
                               "request": {"operation": operation, "userInfo": {"username": user}}}
    if not all(cel.evaluate(c["expression"], context) for c in spec["matchConditions"]):
        return None
    context["variables"] = {v["name"]: cel.evaluate(v["expression"], context) for v in spec["variables"]}
    return [cel.evaluate(v["messageExpression"], context) for v in spec["validations"]
            if cel.evaluate(v["expression"], context) is not True]


def python_create(new: dict[str, Any]) -> str:
    with pytest.raises(Denied) as denied:
        owned.created(new, CONFIG)
    return denied.value.message


@pytest.mark.parametrize("annotation", BIND_ANNOTATIONS)
def test_a_new_pod_carrying_an_owned_annotation_is_denied_with_the_servers_message(docs, cel, annotation) -> None:
    new = pod(**{annotation: "x", "team": "a"})
    assert guard(docs, cel, "CREATE", new, user=OWNER) == [python_create(new)]
    assert annotation in python_create(new)


@pytest.mark.parametrize("annotation", BIND_ANNOTATIONS)
@pytest.mark.parametrize("edit", ["add", "change", "remove"])
def test_a_tenant_may_not_touch_an_owned_annotation(docs, cel, annotation: str, edit: str) -> None:
    before, after = {"add": ({}, {annotation: "1"}), "change": ({annotation: "1"}, {annotation: "2"}),
                     "remove": ({annotation: "1"}, {})}[edit]
    old, new = pod(**before, team="a"), pod(**after, team="a")
    expected = owned.updated(old, new, TENANT, CONFIG)
    assert not expected.allowed and annotation in expected.message and OWNER in expected.message
    assert guard(docs, cel, "UPDATE", new, old) == [expected.message]
    # Their owners may: the policy is not even evaluated for them.
    assert guard(docs, cel, "UPDATE", new, old, user=OWNER) is None
    assert owned.updated(old, new, OWNER, CONFIG).allowed


@pytest.mark.parametrize("case", ["status", "other-annotation", "same-value", "no-annotations"])
def test_updates_that_leave_owned_annotations_alone_are_not_matched(docs, cel, case: str) -> None:
    """kubelet's status updates and everyone's other edits never reach a validation (nor, in webhook mode,
    the webhook)."""
    kept = {BIND_ANNOTATIONS[-1]: "success"}
    old, new = {"status": (pod(**kept), pod(**kept)), "other-annotation": (pod(**kept), pod(**kept, team="b")),
                "same-value": (pod(**kept), pod(**kept)), "no-annotations": (pod(), pod())}[case]
    if case == "status":
        new["status"] = {"phase": "Running"}
    assert guard(docs, cel, "UPDATE", new, old) is None
    assert owned.updated(old, new, TENANT, CONFIG).allowed
    assert guard(docs, cel, "CREATE", pod(team="a")) is None


def test_the_policy_lists_the_servers_defaults(docs) -> None:
    policy = configuration(docs, "ValidatingAdmissionPolicy", GUARD)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [GUARD_RULE]
    # Every namespace: no exclusions, no ignore label (docs/operating.md says why).
    assert "namespaceSelector" not in spec["matchConstraints"]
    text = " ".join(c["expression"] for c in spec["matchConditions"])
    assert re.findall(r"'([^']+)'\]\.exists", text) == [BIND_ANNOTATIONS[-1]]
    assert all(f"'{a}'" in text for a in (*BIND_ANNOTATIONS, *ANNOTATION_OWNERS))
    bindings = {d["metadata"]["name"]: d["spec"] for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == GUARD}
    assert {n: b["validationActions"] for n, b in bindings.items()} == {GUARD: ["Deny"],
                                                                       f"{GUARD}-warn": ["Warn", "Audit"]}
    assert [b["matchResources"]["namespaceSelector"]["matchExpressions"][0]["operator"]
            for b in bindings.values()] == ["NotIn", "In"]


def component() -> list[dict[str, Any]]:
    return manifests.load(manifests.base_dir() / "components" / "guard-webhook" / "webhook.yaml")


def test_the_webhook_component_has_the_policys_conditions_and_a_handler(docs) -> None:
    (config,) = component()
    policy = configuration(docs, "ValidatingAdmissionPolicy", GUARD)["spec"]
    hooks = config["webhooks"]
    assert [(h["name"], h["clientConfig"]["service"]["path"]) for h in hooks] == [
        ("guard.hami-mt.mthreads.com", "/validate-pods"), ("guard-warn.hami-mt.mthreads.com", "/warn/validate-pods")]
    for hook, operator in zip(hooks, ("NotIn", "In"), strict=True):
        assert hook["matchConditions"] == policy["matchConditions"]
        assert hook["rules"] == [GUARD_RULE]
        assert hook["clientConfig"]["service"] == {**hook["clientConfig"]["service"], "namespace": NS, "name": NAME}
        assert hook["namespaceSelector"] == {"matchExpressions": [
            {"key": "hami.io/enforcement", "operator": operator, "values": ["warn"]}]}
        assert "objectSelector" not in hook
        assert review.route(hook["clientConfig"]["service"]["path"].lstrip("/"), CONFIG)[1] is not None


@needs_kubectl
def test_the_webhook_component_replaces_the_policy(tmp_path: Path) -> None:
    rendered = with_components(tmp_path, "guard-webhook")
    names = {(d["kind"], d["metadata"]["name"]) for d in rendered}
    assert ("ValidatingWebhookConfiguration", GUARD) in names
    assert not {n for n in names if n[1].startswith(GUARD) and n[0] != "ValidatingWebhookConfiguration"}
    assert ("ValidatingAdmissionPolicy", "hami-mt-backstop") in names
