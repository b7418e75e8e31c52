"""SPEC 4.6 through the admission layer: the webhook side of the annotation guard (components/guard-webhook,
the chart's annotationGuard.enforcer=webhook), as kube-apiserver sends it AdmissionReviews."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from hami_mt_webhook.admission import review
from hami_mt_webhook.rules.config import ANNOTATION_OWNERS, BIND_ANNOTATIONS, Config

# Much the list tests/admission/test_chain.py imports, deliberately: each module names the builders it uses.
from tests.builders import (
    DEBUGGER,
    MEMORY,
    ROOT_DEBUGGER,
    VGPU,
    bound_pod,
    container,
    make_pod,
    nodes_view,
    review_body,
)

VIEW = nodes_view()
CONFIG = Config()
TENANT = "system:serviceaccount:team-a:builder"
PHASE = "hami.io/bind-phase"


def update(old: dict[str, Any], new: dict[str, Any], user: str = TENANT, subresource: str = "") -> dict[str, Any]:
    body = review_body(new, "UPDATE", old=old)
    body["request"]["userInfo"] = {"username": user, "groups": ["system:authenticated"]}
    if subresource:
        body["request"]["subResource"] = subresource
    return body


def answer(body: dict[str, Any], path: str = "validate-pods", config: Config = CONFIG) -> dict[str, Any]:
    reply = review.handle(orjson.dumps(body), path, VIEW, config)
    assert reply.status == 200
    response: dict[str, Any] = orjson.loads(reply.body)["response"]
    assert "patch" not in response  # the guard never mutates
    return response


def running(**annotations: str) -> dict[str, Any]:
    """A plain pod (no slices: the guard looks at every pod), bound and running."""
    return make_pod(container("c"), annotations={"team": "a", **annotations}, nodeName="node-1")


@pytest.mark.parametrize("subresource", ["", "status"])
@pytest.mark.parametrize("annotation", BIND_ANNOTATIONS)
def test_a_tenants_annotate_is_denied_naming_the_annotation_and_its_owners(annotation: str, subresource: str) -> None:
    old = running()
    new = running(**{annotation: "x"})
    response = answer(update(old, new, subresource=subresource))
    assert response["allowed"] is False and response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith(f"annotation {annotation} ") and all(o in message for o in ANNOTATION_OWNERS)


@pytest.mark.parametrize("edit", ["change", "remove"])
def test_changing_or_removing_one_is_denied_too(edit: str) -> None:
    old = running(**{PHASE: "allocating"})
    new = running(**({PHASE: "success"} if edit == "change" else {}))
    assert answer(update(old, new))["allowed"] is False


def test_the_owners_may_change_them() -> None:
    old, new = running(**{PHASE: "allocating"}), running(**{PHASE: "success", BIND_ANNOTATIONS[0]: "x"})
    for owner in ANNOTATION_OWNERS:
        assert answer(update(old, new, user=owner))["allowed"] is True
        assert answer(update(old, new, user=owner, subresource="status"))["allowed"] is True


def test_a_review_without_a_username_is_no_owners() -> None:
    body = update(running(), running(**{PHASE: "x"}))
    for info in (None, "alice", {"groups": ["system:masters"]}):
        body["request"]["userInfo"] = info
        assert answer(body)["status"]["code"] == 403


def test_configured_owners_replace_the_defaults() -> None:
    config = Config(annotation_owners=("system:serviceaccount:hami:hami-scheduler",))
    old, new = running(), running(**{PHASE: "success"})
    assert answer(update(old, new, user="system:serviceaccount:hami:hami-scheduler"), config=config)["allowed"]
    denied = answer(update(old, new, user=ANNOTATION_OWNERS[0]), config=config)
    assert not denied["allowed"] and "only system:serviceaccount:hami:hami-scheduler may" in denied["status"]["message"]


def test_updates_that_leave_them_alone_pass() -> None:
    """kubelet's status updates and other edits (the guard's conditions never send them; the answer holds
    anyway)."""
    old = running(**{PHASE: "success"})
    status = running(**{PHASE: "success"})
    status["status"] = {"phase": "Running"}
    assert answer(update(old, status, user="system:node:node-1", subresource="status"))["allowed"] is True
    assert answer(update(old, running(**{PHASE: "success"}, owner="b")))["allowed"] is True


def test_a_new_pod_of_any_kind_carrying_one_is_denied() -> None:
    """SPEC 4.5/4.6: a pod without slices, or on another scheduler, is still denied, by both handlers."""
    for pod in (make_pod(container("c"), annotations={PHASE: "success"}),
                make_pod(container("c", limits={VGPU: 1, MEMORY: 32}), annotations={PHASE: "success"},
                         schedulerName="other")):
        response = answer(review_body(pod))
        assert not response["allowed"] and response["status"]["message"].startswith(f"annotation {PHASE} ")
        out, decision = review.admit_review(review_body(pod), VIEW, CONFIG)
        assert not decision.allowed and decision.reason == "bind-annotation"
    assert answer(review_body(make_pod(container("c"))))["allowed"] is True


def test_warn_mode_warns_instead() -> None:
    """SPEC 4.10: under /warn/ (a namespace labelled warn) and under --enforcement warn alike."""
    old, new = running(), running(**{PHASE: "success"})
    for response in (answer(update(old, new), "warn/validate-pods"),
                     answer(update(old, new), config=Config(enforcement="warn"))):
        assert response["allowed"] is True
        (warning,) = response["warnings"]
        assert warning.startswith(f"would deny: annotation {PHASE} ")
    created = answer(review_body(make_pod(container("c"), annotations={PHASE: "x"})), "warn/validate-pods")
    assert created["allowed"] is True and created["warnings"][0].startswith(f"would deny: annotation {PHASE} ")


def test_ephemeral_containers_are_still_judged_after_the_guard() -> None:
    old = bound_pod(DEBUGGER)
    assert answer(update(old, bound_pod(DEBUGGER, ROOT_DEBUGGER), subresource="ephemeralcontainers"))["allowed"] \
        is False
    # The bound pod carries an owned annotation, unchanged: only the privilege rule speaks.
    assert answer(update(old, bound_pod(DEBUGGER), subresource="ephemeralcontainers"))["allowed"] is True
