"""The one mutate-then-validate combinator: both pod webhooks chained as the API server calls them."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from hami_mt_webhook.admission import review
from hami_mt_webhook.admission.pod_webhooks import admit_pod, in_turn, mutate_pods
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.decision import Decision
from tests.builders import (
    CORE,
    DEBUGGER,
    MEMORY,
    ROOT_DEBUGGER,
    SCHEDULER,
    VGPU,
    WHOLE,
    bound_pod,
    container,
    make_pod,
    nodes_view,
    review_body,
)

VIEW = nodes_view()
CONFIG = Config()
IGNORE = {"hami.io/webhook": "ignore"}


def test_a_review_of_a_labelled_pod_gets_only_the_validating_webhook():
    """SPEC 4.8: the label keeps mutate-pods away (its objectSelector), so nothing is filled or warned."""
    body = review_body(make_pod(container(limits={VGPU: 1, MEMORY: 32}), labels=IGNORE,
                                schedulerName=SCHEDULER))
    out, decision = review.admit_review(body, VIEW, CONFIG)
    assert decision.allowed and "patch" not in out["response"] and decision.warnings == []
    body = review_body(make_pod(container(limits={VGPU: 1, MEMORY: 32}), labels=IGNORE))
    out, decision = review.admit_review(body, VIEW, CONFIG)
    assert out["response"]["allowed"] is False and decision.reason == "unmutated"
    assert "label skips the mutation only" in decision.message


def test_admit_skips_the_mutation_of_a_labelled_pod_as_the_api_server_does():
    body = make_pod(container("c", {VGPU: "1", MEMORY: "32"}), labels=IGNORE, schedulerName="hami-scheduler",
                    defaults=False)
    d = admit_pod(body, VIEW, CONFIG)
    assert d.allowed and d.patch == [] and d.warnings == []  # not filled: the mutation did not run
    mixed = make_pod(container("c", {VGPU: "1", WHOLE: "1"}), labels=IGNORE, schedulerName="hami-scheduler")
    assert admit_pod(mixed, VIEW, CONFIG).reason == "mixing"


def test_a_validating_denial_keeps_the_mutating_warnings():
    def later(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
        """A validating webhook that refuses what the mutating one produced."""
        return Decision.deny("refused after the mutation", "later", obj=request["object"])

    request = review_body(make_pod(container(limits={VGPU: 1})))["request"]
    decision = in_turn(mutate_pods, later)(request, VIEW, CONFIG)
    assert not decision.allowed and decision.reason == "later" and decision.patch == []
    assert any("alone takes a whole card" in w for w in decision.warnings)


def test_new_ephemeral_containers_are_judged_through_the_chain():
    running = make_pod(container(limits={VGPU: 1, MEMORY: 32, CORE: 8}), schedulerName=SCHEDULER,
                       nodeName="s5000-node")
    debugged = copy.deepcopy(running)
    debugged["spec"]["ephemeralContainers"] = [{"name": "root", "image": "busybox",
                                                "securityContext": {"privileged": True}}]
    body = review_body(debugged, operation="UPDATE", old=running)
    body["request"]["subResource"] = "ephemeralcontainers"
    out, decision = review.admit_review(body, VIEW, CONFIG)
    assert out["response"]["allowed"] is False and decision.reason == "privileged"


def test_the_validating_webhook_reviews_the_ephemeralcontainers_subresource():
    body = review_body(bound_pod(ROOT_DEBUGGER), operation="UPDATE", old=bound_pod())
    body["request"]["subResource"] = "ephemeralcontainers"
    reply = review.handle(orjson.dumps(body), "validate-pods", VIEW, CONFIG)
    assert reply.status == 200 and reply.decision is not None and not reply.decision.allowed
    assert (d := review.handle(orjson.dumps(body), "mutate-pods", VIEW, CONFIG).decision) and d.allowed
    body["request"]["object"]["spec"]["ephemeralContainers"] = [DEBUGGER]
    assert (d := review.handle(orjson.dumps(body), "validate-pods", VIEW, CONFIG).decision) and d.allowed


def test_a_kind_that_is_not_a_string_is_answered():
    body = review_body(make_pod(container(limits={VGPU: 1})))
    body["request"]["kind"]["kind"] = ["Deployment"]
    for webhook in review.WEBHOOKS:
        reply = review.handle(orjson.dumps(body), webhook, VIEW, CONFIG)
        assert reply.status == 200 and orjson.loads(reply.body)["response"]["allowed"] is True
    out, decision = review.admit_review(body, VIEW, CONFIG)
    assert out["response"]["allowed"] is True and decision.patch == []
