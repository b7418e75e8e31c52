"""One call for a slice pod: kube-apiserver sends the validating webhook only pods changed after ours (SPEC 5).

The mutating webhook records what it decided (hami_mt_webhook/rules/record.py); the validating configuration's
matchCondition compares that record with the final object. These tests count the validating webhook's reviews
(its own metric) while other mutators change each field the validating rules read after ours.

"After ours" is arranged as kube-apiserver does it: a webhook sorted after ours changes the pod only on its
reinvocation, which a second webhook after it (adding a label) triggers; our webhook's own reinvocation has
run by then, so only the validating webhook can see the change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.waiting import until
from hami_mt_webhook.rules.config import BIND_ANNOTATIONS
from hami_mt_webhook.rules.record import RECORD

from .mutators import LoopbackWebhook, serves_mutating_policies

# Much the list test_webhook.py imports, deliberately: each module names the constants and helpers it uses.
from .support import (
    CORE,
    MEMORY,
    ON_S4000,
    ON_S5000,
    RETIRED,
    VGPU,
    WHOLE,
    apply,
    exists,
    metric,
    namespace,
    pod,
    resources,
    stored,
    wait_for,
)

NS = "e2e-one-hop"
#: The label the second webhook adds; the first one changes a pod only once it sees it (its reinvocation).
LABEL = "e2e.hami-mt/relabelled"
#: The JSON Patch the meddling webhook applies, carried by the pod itself so one server serves every test.
PATCH = "e2e.hami-mt/meddle"
SELECT = {"e2e-one-hop": "yes"}


def meddle(path: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """/label adds LABEL; /meddle applies the pod's PATCH annotation once the pod carries LABEL."""
    labels, annotations = obj["metadata"].get("labels") or {}, obj["metadata"].get("annotations") or {}
    if path == "/label" and LABEL not in labels:
        return [{"op": "add", "path": f"/metadata/labels/{LABEL.replace('/', '~1')}", "value": "yes"}]
    if path == "/meddle" and LABEL in labels and PATCH in annotations:
        return list(json.loads(annotations[PATCH]))
    return []


ns = namespace(NS)


def until_applied(controlplane, labels: dict[str, str], check: Callable[[Any], bool]) -> None:
    """Admission configurations reach the chain a moment after they are stored: dry-run a probe until it shows."""
    probe = pod("probe", {VGPU: 1, MEMORY: 32, CORE: 8}, labels=labels, nodeSelector=ON_S4000)
    until(f"an admission configuration acting on a pod labelled {labels}",
          lambda: check(apply(controlplane, NS, probe, "--dry-run=server", "-o", "json")), 30, 0.2)


@pytest.fixture(scope="module")
def later(controlplane, webhook, ns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Two webhooks sorted after ours ("zy-", "zz-"), for pods labelled SELECT only."""
    server = LoopbackWebhook(tmp_path_factory.mktemp("mutators"), meddle)
    configs = [server.configuration("zy-meddler", "/meddle", {"matchLabels": SELECT}),
               server.configuration("zz-labeller", "/label", {"matchLabels": SELECT})]
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(configs))
    until_applied(controlplane, SELECT,
                  lambda r: r.returncode == 0 and LABEL in json.loads(r.stdout)["metadata"]["labels"])
    try:
        yield
    finally:
        for config in configs:
            controlplane.kubectl("delete", "mutatingwebhookconfiguration", config["metadata"]["name"], check=False)
        server.close()


def validations(webhook) -> float:
    return metric(webhook, "hami_mt_webhook_reviews_total", webhook="validate-pods")


def meddled(name: str, *limits: dict[str, Any], patch: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A slice pod that the webhook after ours changes by `patch` once ours has had its last word."""
    manifest = pod(name, *limits, labels=dict(SELECT), **spec)
    manifest["metadata"]["annotations"] = {PATCH: json.dumps(patch)}
    return manifest


def both(index: int, resource: str, value: str, group: str = "containers") -> list[dict[str, Any]]:
    """Set `resource` in a container's limits and requests alike (the API server requires them equal)."""
    escaped = resource.replace("/", "~1")
    return [{"op": "add", "path": f"/spec/{group}/{index}/resources/{part}/{escaped}", "value": value}
            for part in ("limits", "requests")]


def test_the_validating_webhook_receives_none_of_the_slice_pods_nothing_changed(controlplane, webhook, ns):
    shapes = [({VGPU: 1},), ({VGPU: 1, MEMORY: 32, CORE: 8},), ({VGPU: 1, MEMORY: 20},), ({MEMORY: 8, CORE: 4},),
              ({VGPU: 2},), ({VGPU: 1, MEMORY: 16}, {"cpu": "10m"}), ({WHOLE: 1}, {VGPU: 1, MEMORY: 8, CORE: 2})]
    before, mutated = validations(webhook), metric(webhook, "hami_mt_webhook_reviews_total", webhook="mutate-pods")
    for i, limits in enumerate(shapes * 2):
        r = apply(controlplane, ns, pod(f"quiet-{i}", *limits, nodeSelector=ON_S5000))
        assert r.returncode == 0, r.stderr
        obj = stored(controlplane, ns, f"quiet-{i}")
        assert obj["spec"]["schedulerName"] == "hami-scheduler" and RECORD in obj["metadata"]["annotations"]
    assert metric(webhook, "hami_mt_webhook_reviews_total", webhook="mutate-pods") == mutated + 2 * len(shapes)
    assert validations(webhook) == before  # 0 of 14


def test_webhooks_after_ours_that_change_nothing_checked_cost_no_validating_call(controlplane, webhook, ns, later):
    """The arrangement itself: without a change, the two webhooks after ours cost no validating call."""
    before = validations(webhook)
    r = apply(controlplane, ns, meddled("unchanged", {VGPU: 1, MEMORY: 32, CORE: 8}, patch=[]))
    assert r.returncode == 0, r.stderr
    assert stored(controlplane, ns, "unchanged")["metadata"]["labels"][LABEL] == "yes"
    assert validations(webhook) == before


#: One case per field the validating rules read: (pod's limits, extra spec, patch after ours, denial text).
FIELDS: dict[str, tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], str | None]] = {
    "scheduler-name-retired": ({VGPU: 1, MEMORY: 32, CORE: 8}, {},
                               [{"op": "replace", "path": "/spec/schedulerName", "value": RETIRED}], None),
    "scheduler-name-other": ({VGPU: 1, MEMORY: 32, CORE: 8}, {},
                             [{"op": "replace", "path": "/spec/schedulerName", "value": "volcano"}], None),
    "node-name": ({VGPU: 1, MEMORY: 32, CORE: 8}, {},
                  [{"op": "add", "path": "/spec/nodeName", "value": "mtt-s5000-0"}], "sets spec.nodeName"),
    "slice-memory": ({VGPU: 1, MEMORY: 32, CORE: 8}, {}, both(0, MEMORY, "20"), "would be set to"),
    "slice-memory-valid": ({VGPU: 1, MEMORY: 32, CORE: 8}, {}, both(0, MEMORY, "64"), None),
    "slice-core": ({VGPU: 1, MEMORY: 32, CORE: 8}, {}, both(0, CORE, "24"), "sgpu-core 24 is not valid"),
    "slice-vgpu": ({VGPU: 1, MEMORY: 32, CORE: 8}, {}, both(0, VGPU, "2"), "mthreads.com/vgpu 2"),
    # The author named hami-scheduler, so the backstop lets the pod by; ours never saw slices, so no record.
    "slice-added": ({"cpu": "10m"}, {"schedulerName": "hami-scheduler"}, both(0, MEMORY, "20"), "would be set to"),
    # A whole card beside slices in one container is the backstop's too, and it runs first: see below.
    "whole-card-other-container": ({VGPU: 1, MEMORY: 32, CORE: 8}, {"containers": [
        {"name": "c0", "image": "busybox", "resources": {"limits": {VGPU: "1", MEMORY: "32", CORE: "8"}}},
        {"name": "c1", "image": "busybox", "resources": {"limits": {"cpu": "10m"}}}]}, both(1, WHOLE, "1"), None),
    "init-container": ({VGPU: 1, MEMORY: 32, CORE: 8},
                       {"initContainers": [{"name": "init", "image": "busybox",
                                            "resources": {"limits": {MEMORY: "8", CORE: "2"}}}]},
                       both(0, MEMORY, "20", "initContainers"), "would be set to"),
    "sidecar": ({VGPU: 1, MEMORY: 64, CORE: 8},
                {"initContainers": [{"name": "init", "image": "busybox",
                                     "resources": {"limits": {VGPU: "1", MEMORY: "64", CORE: "8"}}}]},
                [{"op": "add", "path": "/spec/initContainers/0/restartPolicy", "value": "Always"}],
                "share one card"),
    "privileged": ({VGPU: 1, MEMORY: 32, CORE: 8}, {},
                   [{"op": "add", "path": "/spec/containers/0/securityContext", "value": {"privileged": True}}],
                   "is privileged"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(FIELDS))
def test_a_change_after_ours_reaches_the_validating_webhook(controlplane, webhook, ns, later, case):
    """Denied by the validating webhook as SPEC 5 says, or (None) checked there and allowed as changed."""
    limits, spec, patch, denial = FIELDS[case]
    name = f"field-{case}"
    before = validations(webhook)
    r = apply(controlplane, ns, meddled(name, limits, patch=patch, nodeSelector=ON_S4000, **spec))
    assert validations(webhook) == before + 1
    if denial is None:
        assert r.returncode == 0, r.stderr
        obj = stored(controlplane, ns, name)
        for op in patch:  # the change after ours is what was stored: checked, not undone
            node: Any = obj
            for key in op["path"].split("/")[1:]:
                key = key.replace("~1", "/")
                node = node[int(key)] if isinstance(node, list) else node[key]
            assert node == op["value"]
        return
    assert r.returncode != 0, f"{case}: admitted"
    assert 'admission webhook "validate.hami-mt.mthreads.com" denied' in r.stderr and denial in r.stderr, r.stderr
    assert not exists(controlplane, ns, name)


#: Changes after ours that the backstop policy denies before the validating webhook would be called.
BACKSTOPPED = {
    "scheduler-name": ([{"op": "replace", "path": "/spec/schedulerName", "value": "default-scheduler"}],
                       "spec.schedulerName is default-scheduler"),
    "whole-card": (both(0, WHOLE, "1"), "mixes mthreads.com/gpu (whole card) with sGPU slice resources"),
}


@pytest.mark.parametrize("case", sorted(BACKSTOPPED))
def test_a_change_after_ours_that_the_backstop_denies(controlplane, webhook, ns, later, case):
    patch, denial = BACKSTOPPED[case]
    r = apply(controlplane, ns, meddled(f"backstopped-{case}", {VGPU: 1, MEMORY: 32, CORE: 8}, patch=patch))
    assert r.returncode != 0 and "ValidatingAdmissionPolicy 'hami-mt-backstop'" in r.stderr and denial in r.stderr


@pytest.mark.parametrize("annotation", BIND_ANNOTATIONS)
def test_an_owned_annotation_added_after_ours_is_denied_by_the_guard(controlplane, webhook, ns, later, annotation):
    """SPEC 4.6: the annotation guard policy runs before the validating webhook, which is then not called."""
    patch = [{"op": "add", "path": f"/metadata/annotations/{annotation.replace('/', '~1')}", "value": "x"}]
    before = validations(webhook)
    r = apply(controlplane, ns, meddled(f"guarded-{BIND_ANNOTATIONS.index(annotation)}", {VGPU: 1, MEMORY: 32, CORE: 8},
                                        patch=patch))
    assert r.returncode != 0 and "ValidatingAdmissionPolicy 'hami-mt-annotation-guard'" in r.stderr, r.stderr
    assert f"annotation {annotation} is written by" in r.stderr
    assert validations(webhook) == before


# --- a hand-written record -----------------------------------------------------------------------------------


def forged(manifest: dict[str, Any], value: str) -> dict[str, Any]:
    manifest["metadata"].setdefault("annotations", {})[RECORD] = value
    return manifest


def outcome(controlplane, webhook, manifest: dict[str, Any]) -> tuple[int, Any, float]:
    """What creating `manifest` gives: exit code, the stored pod's spec as admitted (or the denial), validating
    calls. The node kube-scheduler may have bound the pod to since is left out: it is not admission's doing."""
    before = validations(webhook)
    r = apply(controlplane, NS, manifest)
    name = manifest["metadata"]["name"]
    result = admitted_spec(stored(controlplane, NS, name)) if r.returncode == 0 else r.stderr.replace(name, "NAME")
    return r.returncode, result, validations(webhook) - before


def admitted_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj["spec"].items() if k != "nodeName"}


#: Records a pod's author might write: one that matches the pod as written, one for what it would become.
FORGERIES = ["v1||000000000||:1/1,20/20,-/-", "v1||000000000||:1/1,32/32,-/-", "v1||000000000||:-/-,-/-,-/-",
             "anything"]
CASES = {
    "mutated": lambda name: pod(name, {VGPU: 1, MEMORY: 20}, nodeSelector=ON_S4000),
    "ignore-label-off-tier": lambda name: pod(name, {VGPU: 1, MEMORY: 20}, labels={"hami.io/webhook": "ignore"},
                                              schedulerName="hami-scheduler", nodeSelector=ON_S4000),
    "ignore-label-default-scheduler": lambda name: pod(name, {VGPU: 1, MEMORY: 32},
                                                       labels={"hami.io/webhook": "ignore"}),
    "other-scheduler-mixed": lambda name: pod(name, {VGPU: 1, MEMORY: 20, WHOLE: 1}, schedulerName="volcano"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hand_written_record_changes_nothing(controlplane, webhook, ns, case):
    make = CASES[case]
    plain = outcome(controlplane, webhook, make(f"plain-{case}"))
    for i, value in enumerate(FORGERIES):
        name = f"forged-{case}-{i}"
        manifest = forged(make(name), value)
        assert outcome(controlplane, webhook, manifest)[:1] == plain[:1], value
        code, result, calls = outcome(controlplane, webhook, forged(make(name + "x"), value))
        assert (code, calls) == (plain[0], plain[2]), value
        if code == 0:
            obj = stored(controlplane, ns, name + "x")
            assert admitted_spec(obj) == plain[1]
            annotations = obj["metadata"]["annotations"]
            expected = stored(controlplane, ns, f"plain-{case}")["metadata"].get("annotations", {}).get(RECORD, value)
            assert annotations[RECORD] == expected  # ours overwrote it, or (not ours to write) it stayed
        else:
            assert result == plain[1].replace(f"plain-{case}", "NAME")


# --- a MutatingAdmissionPolicy, or a webhook where the server has none -----------------------------------------


def _policy(name: str, mutation: str) -> list[dict[str, Any]]:
    api = "admissionregistration.k8s.io/v1"
    return [
        {"apiVersion": api, "kind": "MutatingAdmissionPolicy", "metadata": {"name": name},
         "spec": {"matchConstraints": {"resourceRules": [{"operations": ["CREATE"], "apiGroups": [""],
                                                          "apiVersions": ["v1"], "resources": ["pods"]}]},
                  "matchConditions": [{"name": "selected", "expression":
                                       f"has(object.metadata.labels) && '{name}' in object.metadata.labels"}],
                  "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
                  "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": mutation}}]}},
        {"apiVersion": api, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": name},
         "spec": {"policyName": name}},
    ]


def _cel(patch: list[dict[str, Any]]) -> str:
    """A JSON Patch of string values as a MutatingAdmissionPolicy's CEL expression."""
    return "[" + ", ".join(f"JSONPatch{{op: '{op['op']}', path: '{op['path']}', value: '{op['value']}'}}"
                           for op in patch) + "]"


@pytest.fixture
def policy(controlplane, webhook, tmp_path: Path) -> Iterator[Callable[[str, list[dict[str, Any]]], None]]:
    """`policy(name, patch)`: pods labelled `name` get `patch` from a mutator after ours. A
    MutatingAdmissionPolicy where the server serves them (it runs before the webhooks in every pass, ours
    is reinvoked after its last change); elsewhere a webhook sorted after ours that changes a pod once (ours
    is reinvoked after that change)."""
    policies = serves_mutating_policies(controlplane)
    made: list[tuple[str, str]] = []
    server = None

    def register(name: str, patch: list[dict[str, Any]]) -> None:
        nonlocal server
        if policies:
            controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_policy(name, _cel(patch))))
            made.extend([("mutatingadmissionpolicybinding", name), ("mutatingadmissionpolicy", name)])
            return
        done = "e2e.hami-mt/changed"

        def once(path: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
            labels = obj["metadata"].get("labels") or {}
            return [] if labels.get(done) else \
                [{"op": "add", "path": f"/metadata/labels/{done.replace('/', '~1')}", "value": "yes"}, *patch]

        server = LoopbackWebhook(tmp_path / name, once)
        config = server.configuration(f"zz-{name}", "/", {"matchExpressions": [{"key": name, "operator": "Exists"}]})
        controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))
        made.append(("mutatingwebhookconfiguration", f"zz-{name}"))

    yield register
    for kind, name in made:
        controlplane.kubectl("delete", kind, name, check=False)
    if server is not None:
        server.close()


def test_a_policy_changing_slice_memory_is_checked(controlplane, webhook, ns, policy):
    """kube-apiserver runs the policies before the webhooks in every pass: when the policy changes the pod again
    on its reinvocation, ours is reinvoked after it and snaps the value again, so the change never outlives our
    webhook's last call, and the validating webhook has nothing to add."""
    name = "e2e-map-memory"
    policy(name, both(0, MEMORY, "20"))
    until_applied(controlplane, {name: "yes"}, lambda r: "snapped up" in r.stderr)
    before = validations(webhook)
    r = apply(controlplane, ns, pod("map-memory", {VGPU: 1, MEMORY: 32, CORE: 8}, labels={name: "yes"},
                                    nodeSelector=ON_S4000))
    assert r.returncode == 0, r.stderr
    assert "mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32 (16 GiB)" in r.stderr
    obj = stored(controlplane, ns, "map-memory")
    limits, requests = resources(obj)
    assert limits[MEMORY] == requests[MEMORY] == "32"
    assert obj["metadata"]["annotations"][RECORD] == "v1||000000000||:1/1,32/32,8/8"
    assert validations(webhook) == before


def test_a_policy_adding_a_whole_card_is_denied(controlplane, webhook, ns, policy):
    name = "e2e-map-whole"
    policy(name, both(0, WHOLE, "1"))
    until_applied(controlplane, {name: "yes"}, lambda r: "whole cards, outside HAMi" in r.stderr)
    r = apply(controlplane, ns, pod("map-whole", {VGPU: 1, MEMORY: 32, CORE: 8}, labels={name: "yes"},
                                    nodeSelector=ON_S4000))
    assert r.returncode != 0 and "(whole cards, outside HAMi)" in r.stderr, r.stderr
    assert not exists(controlplane, ns, "map-whole")


def test_get_then_apply_and_recreating_from_the_output_keep_the_record(controlplane, webhook, ns):
    """SPEC 4.7: the webhook's own output admitted again changes nothing, the record included."""
    r = apply(controlplane, ns, pod("again", {VGPU: 1, MEMORY: 20, CORE: 4}, nodeSelector=ON_S5000))
    assert r.returncode == 0 and "snapped up" in r.stderr, r.stderr
    first = stored(controlplane, ns, "again")
    out = controlplane.kubectl("get", "pod", "-n", ns, "again", "-o", "yaml").stdout
    r = controlplane.kubectl("apply", "-f", "-", input=out, check=False)
    assert r.returncode == 0, r.stderr
    assert stored(controlplane, ns, "again")["metadata"]["annotations"][RECORD] == \
        first["metadata"]["annotations"][RECORD]
    manifest = yaml.safe_load(out)
    manifest.pop("status", None)
    manifest["spec"].pop("nodeName", None)  # the scheduler's binding; a new pod must not carry it (SPEC 4.3)
    manifest["metadata"] = {k: v for k, v in manifest["metadata"].items()
                            if k in ("name", "namespace", "labels", "annotations")}
    # A bound pod waits for a kubelet to confirm its deletion, and there is none: remove it at once.
    controlplane.kubectl("delete", "pod", "-n", ns, "again", "--grace-period=0", "--force")
    wait_for("the force-deleted pod gone", lambda: not exists(controlplane, ns, "again"))
    before = validations(webhook)
    r = controlplane.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr
    again = stored(controlplane, ns, "again")
    assert again["metadata"]["annotations"][RECORD] == first["metadata"]["annotations"][RECORD]
    assert again["spec"]["containers"] == first["spec"]["containers"]
    assert validations(webhook) == before


def test_a_pod_with_many_containers_stays_within_the_conditions_cost_budget(controlplane, webhook, ns):
    """kube-apiserver bounds what a matchCondition may cost at run time; an error there would refuse the pod."""
    manifest = pod("many", {VGPU: 1, MEMORY: 8, CORE: 2}, *[{"cpu": "1m", "memory": "1Mi"}] * 150,
                   nodeSelector=ON_S5000)
    manifest["spec"]["initContainers"] = [{"name": f"i{i}", "image": "busybox",
                                           "resources": {"limits": {"cpu": "1m"}}} for i in range(100)]
    before = validations(webhook)
    r = apply(controlplane, ns, manifest)
    assert r.returncode == 0, r.stderr
    assert RECORD in stored(controlplane, ns, "many")["metadata"]["annotations"]
    assert validations(webhook) == before
