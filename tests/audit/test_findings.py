"""The audit's findings: existing objects judged as admission would judge them, in their namespace's mode."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hami_mt_webhook.admission.enforcement import admit_pod
from hami_mt_webhook.audit.findings import (
    FAIL,
    WARN,
    NotReady,
    Snapshot,
    audit,
    counted,
    node_results,
    workload_results,
)
from hami_mt_webhook.audit.registrations import Modes
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from tests.builders import CORE, MEMORY, VGPU, container, make_pod, nodes_view

SLICE = {VGPU: "1", MEMORY: "32", CORE: "8"}
#: 17 of 16 cores: refused by admission, so such a pod only exists if it came before the webhook.
TOO_MANY_CORES = {VGPU: "1", MEMORY: "32", CORE: "17"}


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


NAMESPACES = [namespace("team"), namespace("trial", **{"hami.io/enforcement": "warn"}), namespace("kube-system")]


def stored(pod: dict[str, Any], uid: str, *, bound: bool = True) -> dict[str, Any]:
    """A pod as a list returns it once it is created and bound: a uid, the node's name, the scheduler's
    annotations and a status."""
    out = copy.deepcopy(pod)
    out["metadata"]["uid"] = uid
    if bound:
        out["spec"]["nodeName"] = "s5000-node"
        out["metadata"].setdefault("annotations", {})["hami.io/vgpu-node"] = "s5000-node"
    out["status"] = {"phase": "Running" if bound else "Pending"}
    return out


def admitted(limits: dict[str, str], name: str, ns: str = "team") -> dict[str, Any]:
    """A slice pod created through the webhook: the mutating webhook's result, then bound."""
    decision = admit_pod(make_pod(container("c", limits), name=name, namespace=ns), nodes_view(), Config())
    assert decision.allowed
    return stored(decision.object, uid=f"uid-{name}")


def before_install(limits: dict[str, str], name: str, ns: str = "team", **spec: Any) -> dict[str, Any]:
    """A slice pod created before the webhook: on default-scheduler, its values as written."""
    return stored(make_pod(container("c", limits), name=name, namespace=ns, **spec), uid=f"uid-{name}")


def deployment(name: str, ns: str, limits: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", **meta},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": name}},
                                                 "spec": {"containers": [container("c", limits)]}}}}


def run(**parts: Any) -> Any:
    return audit(Snapshot(namespaces=NAMESPACES, **parts), nodes_view(), Config())


def test_a_pod_admitted_by_the_webhook_and_bound_passes() -> None:
    result = run(pods=[admitted(SLICE, "ok")])
    assert result.results == [] and result.passed == {"team": 1}


def test_a_pod_from_before_the_install_fails_with_the_fix() -> None:
    result = run(pods=[before_install(SLICE, "old")])
    [found] = result.results
    assert (found.rule, found.result, found.subject.label()) == ("slice-pods", FAIL, "Pod team/old")
    assert "on default-scheduler, outside HAMi's accounting" in found.message
    assert "kubectl -n team delete pod old" in found.message
    assert result.passed == {}


def test_a_value_admission_refuses_is_a_failure_under_deny_and_a_warning_under_warn() -> None:
    bad = [before_install(TOO_MANY_CORES, "bad", schedulerName="hami-scheduler"),
           before_install(TOO_MANY_CORES, "bad", "trial", schedulerName="hami-scheduler")]
    result = run(pods=bad)
    assert [(r.subject.namespace, r.rule, r.result) for r in result.results] == [
        ("team", "range", FAIL), ("trial", "range", WARN)]
    message = admit_pod(make_pod(container("c", TOO_MANY_CORES)), nodes_view(), Config()).message
    assert {r.message for r in result.results} == {message}  # admission's own words, in both modes
    assert counted(result.results) == {("range", "team"): 1, ("range", "trial"): 1}


def test_what_binding_adds_is_not_held_against_a_pod() -> None:
    # nodeName and the bind-time annotations are refused on a new pod; a bound pod carries both
    pod = admitted(SLICE, "bound")
    assert pod["spec"]["nodeName"] and "hami.io/vgpu-node" in pod["metadata"]["annotations"]
    assert run(pods=[pod]).results == []


def test_a_pod_in_a_namespace_the_webhooks_skip_is_judged_by_its_scheduler_only() -> None:
    [found] = run(pods=[before_install(TOO_MANY_CORES, "sys", "kube-system")]).results
    assert (found.rule, found.result) == ("slice-pods", FAIL)
    assert "namespace kube-system, which the webhooks skip" in found.message


def test_pods_without_slices_and_pods_being_deleted_are_not_judged() -> None:
    plain = stored(make_pod(container("c", {"cpu": "1"}), name="web"), uid="u1")
    going = before_install(SLICE, "going")
    going["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    result = run(pods=[plain, going])
    assert result.results == [] and result.judged == 0


def test_a_retired_scheduler_fails_and_another_scheduler_warns() -> None:
    config = Config(retired_schedulers=("mt-gpu-scheduler",))
    pods = [before_install(SLICE, "retired", schedulerName="mt-gpu-scheduler"),
            before_install(SLICE, "other", schedulerName="volcano")]
    result = audit(Snapshot(pods=pods, namespaces=NAMESPACES), nodes_view(), config)
    assert {(r.subject.name, r.result) for r in result.results if r.rule == "slice-pods"} == {
        ("retired", FAIL), ("other", WARN)}


def test_a_workload_template_is_judged_in_its_namespace_mode() -> None:
    workloads = [deployment("train", "team", TOO_MANY_CORES), deployment("try", "trial", TOO_MANY_CORES),
                 deployment("good", "team", SLICE), deployment("web", "team", {"cpu": "1"}),
                 deployment("sys", "kube-system", TOO_MANY_CORES)]
    result = run(workloads=workloads)
    assert [(r.subject.label(), r.subject.kind, r.result) for r in result.results] == [
        ("Deployment team/train", "Deployment", FAIL), ("Deployment trial/try", "Deployment", WARN)]
    assert result.results[0].message.startswith('Deployment "train": container "c": mthreads.com/sgpu-core 17')
    assert result.passed == {"team": 1}  # the good one; the one without slices and kube-system's not judged


def test_a_replicaset_its_deployment_owns_is_left_to_the_deployment() -> None:
    owned = deployment("train-5d8f", "team", TOO_MANY_CORES, ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "train", "controller": True}])
    owned["kind"] = "ReplicaSet"
    modes = Modes.of([], Config())
    assert workload_results(owned, modes.mode("team", "validate-workloads"), nodes_view()) is None
    owned["metadata"]["ownerReferences"][0]["kind"] = "SomethingElse"
    [found] = workload_results(owned, modes.mode("team", "validate-workloads"), nodes_view()) or []
    assert found.subject.kind == "ReplicaSet" and found.result == FAIL


def node(name: str, cores: str, memory: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {"capacity": {CORE: cores, MEMORY: memory}}}


@pytest.mark.parametrize(("memory", "expected"), [
    ("1280", []),            # 8 cards of 160: a card size
    ("2048", [WARN]),        # 256 a card: 1.6 times a 160-unit card, the vendor's overcommit
    ("512", [FAIL]),         # 64 a card: no card size, and under any
])
def test_a_node_report_is_judged_by_its_per_card_memory(memory: str, expected: list[str]) -> None:
    results = node_results(node("n", "128", memory), Config()) or []
    assert [r.result for r in results] == expected
    assert all(r.subject.kind == "Node" and r.subject.namespace == "" for r in results)


def test_nodes_without_sliced_cards_are_not_judged() -> None:
    assert node_results({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "8"}}}, Config()) is None
    assert node_results(node("off", "0", "0"), Config()) is None


def test_no_pass_before_the_node_view_is_read() -> None:
    with pytest.raises(NotReady):
        audit(Snapshot(pods=[admitted(SLICE, "ok")]), ClusterView(ready=False), Config())


def test_the_live_registrations_decide_the_mode() -> None:
    # an operator who removed kube-system from the selectors: its pods are judged by admission's rules too
    from hami_mt_webhook.admission import configurations
    docs = copy.deepcopy(configurations.webhook_configurations())
    for doc in docs:
        for hook in doc["webhooks"]:
            for term in hook.get("namespaceSelector", {}).get("matchExpressions", []):
                if term["key"] == "kubernetes.io/metadata.name":
                    term["values"] = [v for v in term["values"] if v != "kube-system"]
    pod = before_install(TOO_MANY_CORES, "sys", "kube-system", schedulerName="hami-scheduler")
    result = audit(Snapshot(pods=[pod], namespaces=NAMESPACES, configurations=docs), nodes_view(), Config())
    assert [(r.rule, r.result) for r in result.results] == [("range", FAIL)]


def test_the_nodes_are_judged_from_the_view_as_from_the_node_objects() -> None:
    """The replicas judge their node view's reports (and the nodes it keeps aside), doctor the Nodes it
    read: the same findings, so a pass need not list 10,000 Nodes."""
    from hami_mt_webhook.audit.findings import Auditing
    from hami_mt_webhook.rules.capacity import report

    nodes = [node("known", "128", "1280"), node("overcommitted", "128", "2048"), node("odd", "128", "512"),
             node("unreadable", "128", "1"), node("off", "0", "0")]
    config = Config()
    view = ClusterView(r for r in (report(n, config) for n in nodes) if r is not None)
    from_view = Auditing([], [], view, config)
    from_view.view_nodes({"unreadable": ("128", "1"), "off": ("0", "0")})
    from_objects = [r for n in nodes for r in node_results(n, config) or ()]
    assert [(r.subject.name, r.result, r.message) for r in from_view.result.results] == [
        (r.subject.name, r.result, r.message) for r in from_objects]
    assert [r.subject.name for r in from_objects] == ["overcommitted", "odd", "unreadable"]
    assert from_view.result.passed == {"": 1}
