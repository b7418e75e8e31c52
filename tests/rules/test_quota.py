"""SPEC.md §4.9: a namespace quota on `limits.` slice keys, which Kubernetes does not enforce, is named at
admission."""

from __future__ import annotations

import json

import pytest

from hami_mt_webhook.admission import review
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.quota import QuotaIndex, limits_only_keys, unenforced_keys, warnings
from tests.builders import CORE, MEMORY, VGPU, WHOLE, container, make_pod, nodes_view, review_body

CONFIG = Config()


def hard(**keys: str) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "spec": {"hard": keys}}


def test_only_limits_keys_on_slice_resources_are_unenforced():
    q = hard(**{f"limits.{MEMORY}": "320", f"limits.{WHOLE}": "2",
                "limits.cpu": "8", f"limits.{CORE}": "32", f"limits.{VGPU}": "4", "pods": "10"})
    assert unenforced_keys(q, CONFIG) == {f"limits.{MEMORY}", f"limits.{CORE}", f"limits.{VGPU}"}
    # A `requests.` twin (or the bare name) is enforced and counts the same: the `limits.` key loses nothing.
    q["spec"]["hard"].update({f"requests.{MEMORY}": "320", CORE: "32"})
    assert unenforced_keys(q, CONFIG) == {f"limits.{VGPU}"}


@pytest.mark.parametrize("obj", [None, "quota", {}, {"spec": None}, {"spec": {"hard": ["limits.x"]}},
                                 {"spec": {"hard": {1: "2"}}}])
def test_malformed_quotas_have_no_keys(obj):
    assert unenforced_keys(obj, CONFIG) == frozenset()


def test_configured_resource_names_are_the_ones_judged():
    config = Config(memory="example.com/mem", core="example.com/core", vgpu="example.com/vgpu")
    q = hard(**{"limits.example.com/mem": "1", f"limits.{MEMORY}": "1"})
    assert unenforced_keys(q, config) == {"limits.example.com/mem"}


def test_a_slice_pod_is_told_which_requests_key_to_write():
    pod = make_pod(container(limits={VGPU: 1}))
    found = warnings(pod, {"gpu-quota": frozenset({f"limits.{MEMORY}", f"limits.{CORE}"})}, CONFIG)
    assert found == [
        f"ResourceQuota 'gpu-quota' sets limits.{CORE}, which is not enforced by Kubernetes: write "
        f"requests.{CORE} (slice pods' requests equal their limits, so it counts the same)",
        f"ResourceQuota 'gpu-quota' sets limits.{MEMORY}, which is not enforced by Kubernetes: write "
        f"requests.{MEMORY} (slice pods' requests equal their limits, so it counts the same)",
    ]


def test_pods_without_slices_and_namespaces_without_such_quotas_get_nothing():
    keys = {"q": frozenset({f"limits.{MEMORY}"})}
    assert warnings(make_pod(container(limits={WHOLE: 1})), keys, CONFIG) == []
    assert warnings(make_pod(container(limits={"cpu": "1"})), keys, CONFIG) == []
    assert warnings(make_pod(container(limits={VGPU: 1})), {}, CONFIG) == []


def test_index_keeps_only_quotas_with_keys_and_forgets_them():
    index = QuotaIndex()
    index.set("a", "q1", frozenset({f"limits.{MEMORY}"}))
    index.set("a", "q2", frozenset({f"limits.{CORE}"}))
    index.set("b", "plain", frozenset())
    assert len(index) == 2 and set(index.get("a")) == {"q1", "q2"} and index.get("b") == {}
    index.set("a", "q1", frozenset())  # edited to requests. keys
    assert dict(index.get("a")) == {"q2": frozenset({f"limits.{CORE}"})}
    index.set("a", "q2", frozenset())
    assert index.get("a") == {} and len(index) == 0
    index.replace({("c", "q"): frozenset({f"limits.{VGPU}"}), ("d", "empty"): frozenset()})
    assert len(index) == 1 and set(index.get("c")) == {"q"}


def _mutate(pod: dict, index: QuotaIndex, namespace: str = "team-a", **request: object) -> dict:
    body = review_body(pod)
    body["request"].update(namespace=namespace, **request)
    reply = review.handle(json.dumps(body).encode(), "mutate-pods", nodes_view(), CONFIG, index)
    return json.loads(reply.body)["response"]


def test_the_mutating_webhook_warns_in_the_quotas_namespace_only():
    index = QuotaIndex()
    index.set("team-a", "gpu-quota", unenforced_keys(hard(**{f"limits.{MEMORY}": "320"}), CONFIG))
    pod = make_pod(container(limits={VGPU: 1}), nodeSelector={"mthreads.com/gpu.product": "MTT-S5000"})
    response = _mutate(pod, index)
    assert response["allowed"] and response["patch"]
    assert f"ResourceQuota 'gpu-quota' sets limits.{MEMORY}, which is not enforced by Kubernetes: write " \
           f"requests.{MEMORY}" in "\n".join(response["warnings"])
    assert not any("ResourceQuota" in w for w in _mutate(pod, index, namespace="team-b").get("warnings", []))
    # Once per pod: the validating webhook and UPDATEs say nothing of it.
    body = review_body(pod)
    body["request"]["namespace"] = "team-a"
    checked = json.loads(review.handle(json.dumps(body).encode(), "validate-pods", nodes_view(), CONFIG,
                                       index).body)["response"]
    assert not any("ResourceQuota" in w for w in checked.get("warnings", []))
    assert not any("ResourceQuota" in w for w in _mutate(pod, index, operation="UPDATE").get("warnings", []))


def test_admit_review_gives_the_same_warning():
    index = QuotaIndex()
    index.set("team-a", "q", frozenset({f"limits.{MEMORY}"}))
    body = review_body(make_pod(container(limits={VGPU: 1, MEMORY: 32}), namespace="team-a"))
    out, decision = review.admit_review(body, nodes_view(), CONFIG, index)
    assert decision.allowed
    assert any(f"write requests.{MEMORY}" in w for w in out["response"]["warnings"])


# limits_only_keys: what `doctor` reports, in the order the slice resources are listed.


def named_quota(**hard: str) -> dict:
    return {"kind": "ResourceQuota", "metadata": {"name": "q"}, "spec": {"hard": dict(hard)}}


@pytest.mark.parametrize(("hard", "expected"), [
    ({f"limits.{MEMORY}": "64"}, [f"limits.{MEMORY}"]),
    ({f"limits.{MEMORY}": "64", f"limits.{CORE}": "16"}, [f"limits.{MEMORY}", f"limits.{CORE}"]),
    ({f"limits.{MEMORY}": "64", f"requests.{MEMORY}": "64"}, []),   # the twin counts
    ({f"limits.{MEMORY}": "64", MEMORY: "64"}, []),                 # the bare name is requests.
    ({f"requests.{VGPU}": "4"}, []),
    ({"limits.cpu": "4", "limits.mthreads.com/gpu": "2"}, []),       # not slice resources
    ({}, []),
])
def test_lists_limits_keys_of_slice_resources_without_a_requests_twin(hard, expected):
    assert limits_only_keys(named_quota(**hard), Config()) == expected


def test_follows_renamed_resources():
    config = Config(memory="example.com/slice-memory")
    quota = named_quota(**{"limits.example.com/slice-memory": "8", f"limits.{MEMORY}": "8"})
    assert limits_only_keys(quota, config) == ["limits.example.com/slice-memory"]


@pytest.mark.parametrize("odd", [{}, {"spec": None}, {"spec": {"hard": None}}, {"spec": {"hard": ["x"]}}, []])
def test_odd_objects_have_no_keys(odd):
    assert limits_only_keys(odd, Config()) == []
