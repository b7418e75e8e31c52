"""Rollout mode (SPEC.md §4.10): under `warn` a rule's denial is a warning, and the pod is still mutated as far
as the rules can; the same pods under `deny` are denied with the same message."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import orjson
import pytest

from hami_mt_webhook.admission import enforcement, review
from hami_mt_webhook.admission.pod_webhooks import mutate_pods
from hami_mt_webhook.admission.workloads import check as check_workload
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import BIND_ANNOTATIONS, Config
from hami_mt_webhook.rules.decision import Decision
from hami_mt_webhook.rules.quota import QuotaIndex
from hami_mt_webhook.service.metrics import Metrics
from tests.builders import (
    CORE,
    MEMORY,
    ON_S5000,
    SCHEDULER,
    VGPU,
    WHOLE,
    container,
    decode_patch,
    make_pod,
    nodes_view,
    patched,
    review_body,
)

DENY, WARN = Config(), Config(enforcement="warn")
FILLED_S5000 = {VGPU: "1", MEMORY: "160", CORE: "16"}


def mutate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """mutate-pods, as the server's table answers it under `config`, for a pod being created."""
    return enforcement.mutate_step({"operation": "CREATE", "object": pod}, view, config)


def answer(body: dict[str, Any], webhook: str, config: Config = DENY) -> dict[str, Any]:
    reply = review.handle(orjson.dumps(body), webhook, nodes_view(), config)
    assert reply.status == 200
    return orjson.loads(reply.body)["response"]


#: Pods the rules deny, one per kind of denial of sections 3 and 4, and the reason each is counted under.
DENIED = {
    "mixing": (make_pod(container(limits={VGPU: 1, WHOLE: 1})), "mixing"),
    "fraction": (make_pod(container(limits={VGPU: 1, MEMORY: "1.5"})), "quantity"),
    "unequal": (make_pod(container(limits={VGPU: 1, MEMORY: 32}, requests={VGPU: 1, MEMORY: 16})),
                "limits-requests"),
    "core-range": (make_pod(container(limits={VGPU: 1, MEMORY: 32, CORE: 17})), "range"),
    "core-only": (make_pod(container(limits={VGPU: 1, CORE: 4})), "core-without-memory"),
    "too-big": (make_pod(container(limits={VGPU: 1, MEMORY: 400})), "capacity"),
    "multi-card-extra": (make_pod(container(limits={VGPU: 2, MEMORY: 8})), "multi-card"),
    "node-name": (make_pod(nodeName="s5000-node", nodeSelector=ON_S5000), "node-name"),
    "privileged": (make_pod(container(limits={VGPU: 1}, securityContext={"privileged": True}),
                            nodeSelector=ON_S5000), "privileged"),
    "bind-annotation": (make_pod(annotations={BIND_ANNOTATIONS[0]: "x"}, nodeSelector=ON_S5000), "bind-annotation"),
    "one-card": (make_pod(container("a", limits={VGPU: 1, MEMORY: 128}), container("b", limits={VGPU: 1, MEMORY: 64}),
                          nodeSelector=ON_S5000), "one-card"),
}


@pytest.mark.parametrize("case", sorted(DENIED))
def test_every_denial_becomes_a_would_deny_warning_with_its_own_message(case: str) -> None:
    pod, reason = DENIED[case]
    denied = review.admit_pod(pod, nodes_view(), DENY)
    assert not denied.allowed and denied.code == 403 and denied.reason == reason
    warned = review.admit_pod(pod, nodes_view(), WARN)
    assert warned.allowed
    assert "would deny: " + denied.message in warned.warnings
    assert reason in warned.would_deny
    assert warned.object["spec"]["schedulerName"] == SCHEDULER  # the scheduler rewrite always happens


def test_a_container_whose_own_values_are_invalid_is_left_and_the_others_are_filled() -> None:
    pod = make_pod(container("bad", limits={VGPU: 1, MEMORY: "1.5"}), container("good", limits={VGPU: 1, MEMORY: 20}),
                   nodeSelector=ON_S5000)
    warned = mutate(pod, nodes_view(), WARN)
    assert warned.allowed and warned.would_deny == ["quantity"]
    assert warned.warnings[0].startswith('would deny: container "bad": mthreads.com/sgpu-memory limit "1.5" is not')
    assert any("snapped up to 32" in w for w in warned.warnings)
    out = warned.object
    assert out["spec"]["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]
    assert out["spec"]["containers"][1]["resources"]["limits"] == {VGPU: "1", MEMORY: "32"}
    assert out["spec"]["schedulerName"] == SCHEDULER
    # the patch, applied as the API server applies it, gives the same object
    assert patched(pod, {"patch": _b64(warned.patch), "patchType": "JSONPatch"}) == out


def test_pod_level_denials_leave_the_containers_mutated() -> None:
    pod = make_pod(container(limits={VGPU: 1}, securityContext={"privileged": True}), nodeName="s5000-node",
                   nodeSelector=ON_S5000)
    warned = mutate(pod, nodes_view(), WARN)
    assert warned.would_deny == ["node-name", "privileged"]
    assert warned.object["spec"]["containers"][0]["resources"]["limits"] == FILLED_S5000
    assert warned.object["spec"]["nodeName"] == "s5000-node"  # only the rules' own changes are made
    assert warned.object["spec"]["containers"][0]["securityContext"] == {"privileged": True}


def test_containers_that_cannot_share_a_card_keep_the_first_ones_mutation() -> None:
    pod, _ = DENIED["one-card"]
    warned = mutate(pod, nodes_view(), WARN)
    a, b = (c["resources"]["limits"] for c in warned.object["spec"]["containers"])
    assert a == {VGPU: "1", MEMORY: "128"} and b == {VGPU: "1", MEMORY: "64"}
    assert warned.object["spec"]["containers"][0]["resources"]["requests"] == a


def test_warn_output_is_idempotent() -> None:
    """§4.7 holds under warn too: the webhook's own output, admitted again, gets no patch."""
    for pod, _ in DENIED.values():
        first = mutate(pod, nodes_view(), WARN)
        again = mutate(first.object, nodes_view(), WARN)
        assert again.allowed and again.patch == [], pod


def test_allowed_pods_are_answered_alike_in_both_modes() -> None:
    pod = make_pod(container(limits={VGPU: 1, MEMORY: 20}), nodeSelector=ON_S5000)
    body = review_body(pod, uid="u")
    assert answer(body, "mutate-pods", WARN) == answer(body, "mutate-pods", DENY)
    assert answer(body, "warn/mutate-pods") == answer(body, "mutate-pods")


@pytest.mark.parametrize("body", [
    b"not json", b"{}", orjson.dumps({"request": {"operation": "CREATE"}}),
    orjson.dumps({"request": {"uid": "u", "operation": "CREATE"}}),
])
@pytest.mark.parametrize("webhook", ["mutate-pods", "validate-pods", "validate-workloads"])
def test_malformed_reviews_are_answered_the_same_in_both_modes(body: bytes, webhook: str) -> None:
    denied = review.handle(body, webhook, nodes_view(), DENY)
    for config, path in ((WARN, webhook), (DENY, "warn/" + webhook)):
        warned = review.handle(body, path, nodes_view(), config)
        assert (warned.status, warned.body) == (denied.status, denied.body)


def test_a_webhook_not_yet_ready_still_refuses_under_warn() -> None:
    pod = make_pod()
    decision = mutate(pod, ClusterView(ready=False), WARN)
    assert not decision.allowed and decision.code == 503


def test_a_pod_nothing_of_which_can_be_mutated_still_gets_the_scheduler() -> None:
    pod = make_pod(container(limits={VGPU: 1, WHOLE: 1}), schedulerName="mt-old")
    warned = mutate(pod, nodes_view(), dataclasses.replace(WARN, retired_schedulers=("mt-old",)))
    assert warned.would_deny == ["mixing"] and warned.mutations == ["scheduler"]
    assert warned.patch == [{"op": "replace", "path": "/spec/schedulerName", "value": SCHEDULER}]


def test_warn_path_answers_under_warn_whatever_the_server_mode() -> None:
    pod, _ = DENIED["fraction"]
    body = review_body(pod, uid="u")
    denied = answer(body, "mutate-pods")
    assert denied["allowed"] is False
    warned = answer(body, "warn/mutate-pods")
    assert warned["allowed"] is True and "would deny: " + denied["status"]["message"] in warned["warnings"]
    assert [op["path"] for op in decode_patch(warned)] == ["/spec/schedulerName"]
    assert answer(body, "warn/mutate-pods") == answer(body, "mutate-pods", WARN)
    assert review.handle(b"{}", "warn/nothing", nodes_view(), DENY).status == 404


def test_validating_webhook_under_warn() -> None:
    pod = make_pod(container(limits={VGPU: 1, WHOLE: 1}))  # mixing, on default-scheduler
    denied = answer(review_body(pod, uid="u"), "validate-pods")
    warned = answer(review_body(pod, uid="u"), "warn/validate-pods")
    assert warned == {"uid": "u", "allowed": True, "warnings": ["would deny: " + denied["status"]["message"]]}


def test_ephemeral_privileged_container_under_warn() -> None:
    old = make_pod(nodeSelector=ON_S5000)
    obj = {**old, "spec": {**old["spec"], "ephemeralContainers": [
        {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}]}}
    body = review_body(obj, operation="UPDATE", uid="u", old=old)
    body["request"]["subResource"] = "ephemeralcontainers"
    denied = answer(body, "validate-pods")
    assert denied["allowed"] is False
    warned = answer(body, "validate-pods", WARN)
    assert warned["allowed"] is True and warned["warnings"] == ["would deny: " + denied["status"]["message"]]


def test_workload_under_warn_warns_with_its_usual_message() -> None:
    pod, _ = DENIED["core-only"]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train", "namespace": "ml"},
                  "spec": {"template": {"metadata": {}, "spec": pod["spec"]}}}
    body = review_body(deployment, uid="u")
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    denied = answer(body, "validate-workloads")
    assert denied["status"]["message"].startswith('Deployment "train": container "main": mthreads.com/sgpu-core 4')
    warned = answer(body, "warn/validate-workloads")
    assert warned["allowed"] is True and warned["warnings"][-1] == "would deny: " + denied["status"]["message"]
    assert "patch" not in warned
    check = check_workload(deployment, "Deployment", nodes_view(), DENY)
    assert enforcement.soften(check, WARN).would_deny == [check.reason]


def test_would_deny_is_counted_by_rule() -> None:
    metrics = Metrics()
    for case in ("fraction", "node-name"):
        pod, _ = DENIED[case]
        reply = review.handle(orjson.dumps(review_body(pod)), "warn/mutate-pods", nodes_view(), DENY)
        metrics.review("mutate-pods", reply.request, reply.decision, 0.001)
    text = metrics.render().decode()
    assert 'hami_mt_webhook_would_deny_total{rule="quantity"} 1.0' in text
    assert 'hami_mt_webhook_would_deny_total{rule="node-name"} 1.0' in text
    assert 'result="denied"' not in text


def test_deny_mode_is_unchanged_by_the_transform() -> None:
    for pod, _ in DENIED.values():
        request = {"operation": "CREATE", "object": pod}
        assert mutate(pod, nodes_view(), DENY) == mutate_pods(request, nodes_view(), DENY)


def _b64(patch: list[dict[str, Any]]) -> str:
    return base64.b64encode(orjson.dumps(patch)).decode()


def test_warn_path_keeps_the_quota_warning() -> None:
    """§4.9 under §4.10: a pod warned about on /warn/mutate-pods still hears of its namespace's unenforced quota."""
    index = QuotaIndex()
    index.set("team-a", "gpu-quota", frozenset({f"limits.{MEMORY}"}))
    pod, _ = DENIED["fraction"]
    body = review_body(pod, uid="u")
    body["request"]["namespace"] = "team-a"
    for path, config in (("warn/mutate-pods", DENY), ("mutate-pods", WARN)):
        reply = review.handle(orjson.dumps(body), path, nodes_view(), config, index)
        warnings = orjson.loads(reply.body)["response"]["warnings"]
        assert any(w.startswith("would deny: ") for w in warnings), path
        assert any(f"ResourceQuota 'gpu-quota' sets limits.{MEMORY}" in w for w in warnings), path
    out, decision = review.admit_review(body, nodes_view(), WARN, index)
    assert decision.allowed and any("ResourceQuota 'gpu-quota'" in w for w in out["response"]["warnings"])
