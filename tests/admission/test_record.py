"""The record (hami_mt_webhook/rules/record.py) and the validating webhook's matchCondition that rebuilds it in CEL.

The CEL is the manifest's own text, evaluated with `common-expression-language`. That evaluator lacks the
Kubernetes strings library, so `join` is supplied here with the library's meaning (list<string>.join(sep)).
Generated pods check that the CEL string is the Python record, that the record holds everything the
validating rules read, and that the mutating webhook's own output is never sent on.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.clusters import manifests
from hami_mt_webhook.rules import pods as rules
from hami_mt_webhook.rules.config import BIND_ANNOTATIONS, Config
from hami_mt_webhook.rules.record import RECORD, record
from tests.builders import CORE, MEMORY, ON_S4000, ON_S5000, SCHEDULER, VGPU, WHOLE, nodes_view

cel = pytest.importorskip("cel", reason="common-expression-language is not installed")

CONFIG = Config()
VIEW = nodes_view()
CONDITION = "changed-after-mutation"


def fast(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def condition() -> str:
    (hook,) = [w for d in manifests.load() if d["kind"] == "ValidatingWebhookConfiguration"
               and d["metadata"]["name"] == "hami-mt-webhook" for w in d["webhooks"]]
    (found,) = [c["expression"] for c in hook["matchConditions"] if c["name"] == CONDITION]
    return found


def sent(expression: str, obj: dict[str, Any], operation: str = "CREATE") -> bool:
    """The matchCondition's verdict as kube-apiserver evaluates it: True sends the pod to the webhook."""
    context = cel.Context({"object": obj, "request": {"operation": operation}},
                          {"join": lambda items, sep: sep.join(items)})
    result = cel.evaluate(expression, context)
    assert isinstance(result, bool)
    return result


def recorded(pod: dict[str, Any], value: str | None = None) -> dict[str, Any]:
    """`pod` carrying the record annotation: its own record, or `value`."""
    out = copy.deepcopy(pod)
    out.setdefault("metadata", {}).setdefault("annotations", {})[RECORD] = record(out, CONFIG) if value is None \
        else value
    return out


# --- generated pods, as kube-apiserver sends them (quantities canonical strings) -----------------------------------

QUANTITIES = st.sampled_from(["1", "2", "4", "8", "16", "20", "24", "32", "64", "96", "128", "160", "2k", "-1", "500m"])
RESOURCE_NAMES = st.sampled_from([VGPU, MEMORY, CORE, WHOLE, "cpu", "memory"])


@st.composite
def containers(draw, init: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": draw(st.sampled_from(["main", "side", "setup", "x"])), "image": "busybox"}
    shape = draw(st.sampled_from(["limits", "both", "requests", "none", "empty"]))
    limits = draw(st.dictionaries(RESOURCE_NAMES, QUANTITIES, max_size=4))
    if shape == "limits":
        c["resources"] = {"limits": limits}
    elif shape == "both":  # as the API server defaults it: requests from limits, plus its own
        c["resources"] = {"limits": limits, "requests": {**limits, **draw(st.dictionaries(RESOURCE_NAMES, QUANTITIES,
                                                                                          max_size=2))}}
    elif shape == "requests":
        c["resources"] = {"requests": limits}
    elif shape == "empty":
        c["resources"] = {}
    if init and draw(st.booleans()):
        c["restartPolicy"] = draw(st.sampled_from(["Always", "OnFailure"]))
    privileged = draw(st.sampled_from([None, None, True, False]))
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    elif draw(st.booleans()):
        c["securityContext"] = {"runAsNonRoot": True}
    return c


@st.composite
def pods(draw) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(st.lists(containers(), min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(init=True), max_size=2))
    scheduler = draw(st.sampled_from([None, "", SCHEDULER, SCHEDULER, SCHEDULER, "default-scheduler", "volcano"]))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    node = draw(st.sampled_from([None, None, "", "node-1"]))
    if node is not None:
        spec["nodeName"] = node
    spec["nodeSelector"] = draw(st.sampled_from([ON_S4000, ON_S5000, {}]))
    meta: dict[str, Any] = {"name": "p", "namespace": "default"}
    annotations = draw(st.dictionaries(st.sampled_from([*BIND_ANNOTATIONS, "team", "mthreads.com/request-gpu-num"]),
                                       st.sampled_from(["", "x", "1"]), max_size=2))
    if annotations or draw(st.booleans()):
        meta["annotations"] = annotations
    labels = draw(st.sampled_from([None, {}, {"app": "x"}, {"hami.io/webhook": "ignore"}, {"hami.io/webhook": "on"}]))
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def on_hami(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the mutating webhook would leave it to the validating one: on hami-scheduler, not ignore-labelled."""
    out = copy.deepcopy(pod)
    out["spec"]["schedulerName"] = SCHEDULER
    if (out["metadata"].get("labels") or {}).get("hami.io/webhook") == "ignore":
        del out["metadata"]["labels"]["hami.io/webhook"]
    return out


# --- the CEL is the Python record ------------------------------------------------------------------------------


@fast(200)
@given(pods())
def test_the_cel_builds_the_python_record(condition: str, pod: dict[str, Any]) -> None:
    """A pod carrying its own record is not sent; with any other record it is, so the strings are equal."""
    pod = on_hami(pod)
    assert sent(condition, recorded(pod)) is False
    assert sent(condition, recorded(pod, record(pod, CONFIG) + "+")) is True
    assert sent(condition, recorded(pod, record(pod, CONFIG)[:-1])) is True


@fast(150)
@given(pods(), pods())
def test_two_pods_are_told_apart_exactly_when_their_records_differ(condition: str, a: dict, b: dict) -> None:
    a, b = on_hami(a), on_hami(b)
    assert sent(condition, recorded(b, record(a, CONFIG))) is (record(a, CONFIG) != record(b, CONFIG))


@fast(150)
@given(pods())
def test_pods_the_mutating_webhook_did_not_finish_are_always_sent(condition: str, pod: dict[str, Any]) -> None:
    """Another scheduler, none, the ignore label (the mutating webhook skipped it), no record, or an UPDATE."""
    forged = recorded(pod)  # a record the pod's author wrote, right for the pod as it stands
    scheduler = pod["spec"].get("schedulerName")
    ignored = (pod["metadata"].get("labels") or {}).get("hami.io/webhook") == "ignore"
    assert sent(condition, forged) is (scheduler != SCHEDULER or ignored)
    assert sent(condition, forged, operation="UPDATE") is True
    bare = copy.deepcopy(pod)
    bare["metadata"].get("annotations", {}).pop(RECORD, None)
    assert sent(condition, bare) is True


# --- the record holds what the validating rules read ----------------------------------------------------------


def verdict(pod: dict[str, Any]) -> tuple[bool, int, str]:
    decision = rules.validate(pod, VIEW, CONFIG)
    return decision.allowed, decision.code, decision.reason


#: Edits of fields outside the record: none may change the validating webhook's verdict.
OUTSIDE = {
    "container names": lambda p: [c.update(name=c["name"] + "-renamed") for c in p["spec"]["containers"]],
    "images": lambda p: [c.update(image="other") for c in p["spec"]["containers"]],
    "other resources": lambda p: [c.setdefault("resources", {}).setdefault("limits", {}).update(cpu="3")
                                  for c in p["spec"]["containers"]],
    "other annotations": lambda p: p["metadata"].setdefault("annotations", {}).update(
        {"team": "y", "mthreads.com/request-gpu-num": "7"}),
    "other labels": lambda p: p["metadata"].setdefault("labels", {}).update(app="y"),
    "other security settings": lambda p: [c.setdefault("securityContext", {}).update(runAsUser=7)
                                          for c in p["spec"]["containers"]],
    "app restart policy": lambda p: [c.update(restartPolicy="Never") for c in p["spec"]["containers"]
                                     if c.get("restartPolicy") != "Always"],
}


@fast(150)
@given(pods(), st.sampled_from(sorted(OUTSIDE)))
def test_what_the_record_leaves_out_does_not_change_the_verdict(pod: dict[str, Any], edit: str) -> None:
    pod = on_hami(pod)
    other = copy.deepcopy(pod)
    OUTSIDE[edit](other)
    assert record(other, CONFIG) == record(pod, CONFIG)
    assert verdict(other) == verdict(pod)


def _toggle(mapping: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` to `value`, or to something else when it already holds `value`."""
    mapping[key] = value if mapping.get(key) != value else f"{value}0"


def _resources(c: dict[str, Any], part: str) -> dict[str, Any]:
    res = c.setdefault("resources", {})
    return res.setdefault(part, {})


def change(pod: dict[str, Any], field: str) -> None:
    """Change one field the validating rules read (the list of issue #18, plus the sidecar flag)."""
    spec, first = pod["spec"], pod["spec"]["containers"][0]
    if field == "nodeName":
        spec["nodeName"] = "" if spec.get("nodeName") else "node-2"
    elif field == "slice limit":
        _toggle(_resources(first, "limits"), MEMORY, "3")
    elif field == "slice request":
        _toggle(_resources(spec["containers"][-1], "requests"), CORE, "7")
    elif field == "init slice":
        spec.setdefault("initContainers", []).append({"name": "late", "resources": {"limits": {VGPU: "1"}}})
    elif field == "whole card":
        limits, requests = _resources(first, "limits"), _resources(first, "requests")
        if WHOLE in limits or WHOLE in requests:
            limits.pop(WHOLE, None), requests.pop(WHOLE, None)
        else:
            limits[WHOLE] = "1"
    elif field == "privileged":
        security = first.setdefault("securityContext", {})
        security["privileged"] = security.get("privileged") is not True
    elif field == "sidecar":
        inits = spec.get("initContainers") or [{"name": "i"}]
        spec["initContainers"] = inits
        inits[0]["restartPolicy"] = "OnFailure" if inits[0].get("restartPolicy") == "Always" else "Always"
    elif field == "bind annotation":
        annotations = pod["metadata"].setdefault("annotations", {})
        if BIND_ANNOTATIONS[-1] in annotations:
            del annotations[BIND_ANNOTATIONS[-1]]
        else:
            annotations[BIND_ANNOTATIONS[-1]] = ""


INSIDE = ["nodeName", "slice limit", "slice request", "init slice", "whole card", "privileged", "sidecar",
          "bind annotation"]


@fast(150)
@given(pods(), st.sampled_from(INSIDE))
def test_a_change_to_a_field_the_rules_read_is_sent(condition: str, pod: dict[str, Any], edit: str) -> None:
    before = recorded(on_hami(pod))
    after = copy.deepcopy(before)
    change(after, edit)
    assert record(after, CONFIG) != record(before, CONFIG)
    assert sent(condition, after) is True


def test_a_scheduler_change_is_sent(condition: str) -> None:
    pod = recorded(on_hami({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {
        "limits": {VGPU: "1"}}}]}}))
    assert sent(condition, pod) is False
    for name in ("default-scheduler", "", "volcano"):
        pod["spec"]["schedulerName"] = name
        assert sent(condition, pod) is True


# --- the mutating webhook's output ------------------------------------------------------------------------------


@fast(150)
@given(pods(), st.sampled_from([None, "v1||000000000||:1/1,20/20,-/-", "junk"]))
def test_the_mutating_webhooks_output_is_not_sent_and_a_written_record_is_replaced(
    condition: str, pod: dict[str, Any], forged: str | None
) -> None:
    if forged is not None:
        pod = recorded(pod, forged)
    decision = rules.mutate(pod, VIEW, CONFIG)
    if not decision.allowed:
        return
    out = decision.object
    finished = out["spec"].get("schedulerName") == SCHEDULER and any(
        r in (c.get("resources") or {}).get(part, {}) for c in [*out["spec"]["containers"],
                                                              *out["spec"].get("initContainers", [])]
        for part in ("limits", "requests") for r in (VGPU, MEMORY, CORE))
    if finished:
        assert out["metadata"]["annotations"][RECORD] == record(out, CONFIG)
        if (pod["metadata"].get("labels") or {}).get("hami.io/webhook") != "ignore":
            assert sent(condition, out) is False
        assert rules.mutate(out, VIEW, CONFIG).patch == []  # SPEC 4.7: stable under re-admission
    else:  # not ours to write (another scheduler): the condition sends it whatever it carries
        assert sent(condition, out) is True


def test_the_record_names_the_configured_resources() -> None:
    config = Config(vgpu="e.com/v", memory="e.com/m", core="e.com/c", whole_card=("e.com/w",),
                    bind_annotations=("b",))
    pod = {"metadata": {"annotations": {"b": ""}}, "spec": {"nodeName": "n", "containers": [
        {"name": "a", "resources": {"limits": {"e.com/v": "1", "e.com/m": "8", VGPU: "5"},
                                    "requests": {"e.com/w": "1"}}}]}}
    assert record(pod, config) == "v1|N|1||W:1/-,8/-,-/-"


def test_the_record_reads_malformed_pods_without_failing() -> None:
    for pod in ({}, {"metadata": None, "spec": None}, {"spec": {"containers": "x", "initContainers": [None, 3]}},
                {"spec": {"containers": [{"resources": {"limits": [], "requests": "x"}, "securityContext": 1}]}}):
        assert record(pod, CONFIG).startswith("v1|")
