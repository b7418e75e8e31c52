"""Pods the webhook admitted, placed per card by HAMi's scheduler extender as HAMi counts: cards of one node,
memory (512 MiB units, MiB in HAMi's annotations) and cores per card.

Each test has a node of its own, pinned by hostname (the webhook judges a pod's cards by its nodeSelector).
kube-scheduler fits sgpu-memory and sgpu-core against a node's totals before it asks HAMi, as HAMi's chart
configures it, so a full node is refused in kube-scheduler's words; HAMi's own reason is seen when the totals
have room but no single card does. Every pod labelled `expect=bound` had a node that could hold it: the last
test checks none of them was ever refused.

The annotation guard (SPEC 4.6, the base's ValidatingAdmissionPolicy) is on before the first pod: every
annotation HAMi writes at filter and bind passes it as kube-system/hami-scheduler, and a tenant's edit of one
is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from devtools import gpus
from devtools.clusters import hami
from devtools.clusters.controlplane import ControlPlane
from devtools.waiting import until
from hami_mt_webhook.rules.config import BIND_ANNOTATIONS
from tests.e2e.support import CORE, MEMORY, VGPU, apply, pod, stored, wait_for
from tests.e2e.test_annotation_guard import BY_POLICY, annotate, carrying, prepare, refused, tenant

from .conftest import start_webhook

NS = "hami-tier"
EXPECT = "hami-tier/expect"
#: One node per test: eight S5000 cards for the exclusive pods, eight for multi-card and shared-card pods,
#: three for the pods that leave room on no card, and the S4000's one card.
EXCLUSIVE, SHARED, SPLIT, S4000 = "hami-s5000-a", "hami-s5000-b", "hami-s5000-c", "hami-s4000"
MODELS = {EXCLUSIVE: gpus.S5000, SHARED: gpus.S5000, SPLIT: dataclasses.replace(gpus.S5000, cards=3),
          S4000: gpus.S4000}
#: The allocation HAMi writes on the pod at filter time, one `;`-terminated list per container of
#: `:`-terminated `uuid,type,MiB,cores` devices.
ALLOCATED = "hami.io/mthreads-vgpu-devices-allocated"
#: How HAMi's card-level refusals read (pkg/device/common): "3/3 CardInsufficientMemory".
HAMI_REASON = re.compile(r"\b\d+/\d+ [A-Z][A-Za-z]+\b|node unregistered|node usage unavailable")
#: Events a refused pod gets: kube-scheduler's, and HAMi's own at filter and bind.
REFUSALS = ("FailedScheduling", "FilteringFailed", "BindingFailed")
#: The owned annotations HAMi writes on a Moore Threads pod: all but the to-allocate list, at filter (the
#: node, the cards, their indexes and the times) and at bind (the phase, `allocating`, and its time).
WRITTEN = tuple(a for a in BIND_ANNOTATIONS if a != "hami.io/mthreads-vgpu-devices-to-allocate")


@pytest.fixture(scope="module")
def webhook(controlplane: ControlPlane):
    yield from start_webhook(controlplane, [model.node(name) for name, model in MODELS.items()])


@pytest.fixture(scope="module")
def cp(controlplane: ControlPlane, webhook, extender: hami.SchedulerExtender) -> ControlPlane:
    """The control plane once HAMi has registered every card of the module's nodes, with its namespace (and
    a tenant there that may patch pods) and the annotation guard loaded."""
    wanted = {name: model.cards for name, model in MODELS.items()}
    until(f"HAMi's scheduler registering {wanted}", lambda: extender.cards() == wanted)
    prepare(controlplane, NS)
    wait_for("the annotation guard to be loaded",
             lambda: BY_POLICY in apply(controlplane, NS, carrying("probe"), "--dry-run=server").stderr)
    return controlplane


def create(cp: ControlPlane, name: str, *limits: dict[str, Any], on: str, expect: str = "bound") -> str:
    """Create a pod pinned to node `on`; `expect` (bound or pending) is what its node's room says. Returns
    the warnings."""
    manifest = pod(name, *limits, labels={EXPECT: expect}, nodeSelector={
        gpus.PRODUCT: MODELS[on].product, gpus.HOSTNAME: on})
    r = apply(cp, NS, manifest)
    assert r.returncode == 0, r.stderr
    return r.stderr


def bound(cp: ControlPlane, *names: str) -> list[dict[str, Any]]:
    """Wait until every pod named is bound; the pods as stored."""
    def probe() -> list[dict[str, Any]] | None:
        pods = [stored(cp, NS, name) for name in names]
        return pods if all(p["spec"].get("nodeName") for p in pods) else None
    return until(f"{', '.join(names)} bound", probe)


def refusal(cp: ControlPlane, name: str) -> str:
    """Wait for kube-scheduler's FailedScheduling event on the pod; its message."""
    return until(f"a FailedScheduling event for {name}", lambda: next(
        (m for reason, m in events(cp, name) if reason == "FailedScheduling"), None))


def events(cp: ControlPlane, name: str) -> list[tuple[str, str]]:
    found = json.loads(cp.kubectl("get", "events", "-n", NS, f"--field-selector=involvedObject.name={name}",
                                  "-o", "json").stdout)["items"]
    return [(e["reason"], e["message"]) for e in found]


def slices(p: dict[str, Any], index: int = 0) -> dict[str, str]:
    """A container's slice limits, checked equal to its requests (the webhook writes both)."""
    r = p["spec"]["containers"][index]["resources"]
    limits = {k: v for k, v in r["limits"].items() if k in (VGPU, MEMORY, CORE)}
    assert {k: v for k, v in r["requests"].items() if k in limits} == limits
    return limits


def allocated(p: dict[str, Any]) -> list[list[tuple[str, int, int]]]:
    """HAMi's allocation per container: (card uuid, MiB, cores) for each card."""
    containers = p["metadata"]["annotations"][ALLOCATED].split(";")
    assert containers[-1] == "", p["metadata"]["annotations"][ALLOCATED]
    return [[(uuid, int(mib), int(cores)) for uuid, _, mib, cores in (d.split(",") for d in c.split(":") if d)]
            for c in containers[:-1]]


def card(node: str, index: int | str) -> str:
    """HAMi's id for a Moore Threads card: the node's name and the card's index."""
    return f"{node}-mthreads-{index}"


def test_exclusive_pods_take_a_card_each_and_the_ninth_waits_for_one(cp):
    names = [f"exclusive-{i}" for i in range(8)]
    for name in names:
        create(cp, name, {VGPU: 1}, on=EXCLUSIVE)
    pods = bound(cp, *names)
    for p in pods:
        assert slices(p) == {VGPU: "1", MEMORY: "160", CORE: "16"}  # the S5000's whole card, from its capacity
        assert p["spec"]["nodeName"] == EXCLUSIVE
        (devices,) = allocated(p)
        index = p["metadata"]["annotations"]["mthreads.com/gpu-index"]
        assert devices == [(card(EXCLUSIVE, index), 160 * 512, 16)]  # 81,920 MiB and 16 cores: all of it
    assert sorted(int(p["metadata"]["annotations"]["mthreads.com/gpu-index"]) for p in pods) == list(range(8))

    create(cp, "exclusive-8", {VGPU: 1}, on=EXCLUSIVE, expect="pending")
    message = refusal(cp, "exclusive-8")
    # All 1280 units are taken: kube-scheduler refuses the node before HAMi is asked.
    assert f"Insufficient {MEMORY}" in message
    p = stored(cp, NS, "exclusive-8")
    assert slices(p) == {VGPU: "1", MEMORY: "160", CORE: "16"}
    assert not p["spec"].get("nodeName")


def test_an_s4000_card_holds_slices_up_to_its_96_units(cp):
    create(cp, "s4000-32", {VGPU: 1, MEMORY: 32, CORE: 4}, on=S4000)
    assert "snapped up to 32" in create(cp, "s4000-20", {VGPU: 1, MEMORY: 20, CORE: 4}, on=S4000)
    assert "mthreads.com/vgpu 1 added" in create(cp, "s4000-vendor", {MEMORY: 4, CORE: 2}, on=S4000)
    pods = bound(cp, "s4000-32", "s4000-20", "s4000-vendor")
    assert [slices(p) for p in pods] == [{VGPU: "1", MEMORY: "32", CORE: "4"}, {VGPU: "1", MEMORY: "32", CORE: "4"},
                                         {VGPU: "1", MEMORY: "4", CORE: "2"}]
    assert [allocated(p) for p in pods] == [[[(card(S4000, 0), 32 * 512, 4)]], [[(card(S4000, 0), 32 * 512, 4)]],
                                            [[(card(S4000, 0), 4 * 512, 2)]]]  # 68 of the card's 96 units

    create(cp, "s4000-64", {VGPU: 1, MEMORY: 64, CORE: 4}, on=S4000, expect="pending")
    assert f"Insufficient {MEMORY}" in refusal(cp, "s4000-64")  # 28 units left: no node can hold 64
    assert not stored(cp, NS, "s4000-64")["spec"].get("nodeName")


def test_a_two_card_pod_takes_two_whole_cards_of_one_node(cp):
    create(cp, "two-cards", {VGPU: 2}, on=SHARED)
    (p,) = bound(cp, "two-cards")
    assert slices(p) == {VGPU: "2", MEMORY: "320", CORE: "32"}
    assert p["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"
    (devices,) = allocated(p)
    assert len({uuid for uuid, _, _ in devices}) == 2
    assert all(uuid.startswith(card(SHARED, "")) and (mib, cores) == (160 * 512, 16) for uuid, mib, cores in devices)


def test_two_slice_containers_of_one_pod_share_one_card(cp):
    create(cp, "two-containers", {VGPU: 1, MEMORY: 32, CORE: 4}, {VGPU: 1, MEMORY: 64, CORE: 8}, on=SHARED)
    (p,) = bound(cp, "two-containers")
    first, second = allocated(p)
    assert [(mib, cores) for _, mib, cores in first + second] == [(32 * 512, 4), (64 * 512, 8)]
    assert len(first) == len(second) == 1 and first[0][0] == second[0][0]  # HAMi's rule: one card per pod


def test_room_in_the_node_s_totals_but_on_no_card_is_refused_in_hami_s_words(cp):
    names = [f"split-{i}" for i in range(3)]
    for name in names:  # 9 cores each: no two share a card
        create(cp, name, {VGPU: 1, MEMORY: 64, CORE: 9}, on=SPLIT)
    pods = bound(cp, *names)
    assert sorted(allocated(p)[0][0][0] for p in pods) == [card(SPLIT, i) for i in range(3)]

    create(cp, "split-whole", {VGPU: 1}, on=SPLIT, expect="pending")
    message = refusal(cp, "split-whole")
    # 288 units and 21 cores are free in all, 96 units and 7 cores on each card: HAMi finds no card.
    assert "3/3 CardInsufficientMemory" in message, message
    # HAMi's own event on the pod, sent on its own schedule.
    until("HAMi's FilteringFailed event", lambda: ("FilteringFailed", f"1 nodes CardInsufficientMemory({SPLIT})")
          in events(cp, "split-whole"))
    assert not stored(cp, NS, "split-whole")["spec"].get("nodeName")


def test_hami_s_own_annotations_pass_the_guard_and_a_tenant_s_edit_of_one_is_refused(cp):
    create(cp, "guarded", {VGPU: 1, MEMORY: 32, CORE: 4}, on=SHARED)
    (p,) = bound(cp, "guarded")  # HAMi patches the pod at bind before it binds it
    written = {a: v for a, v in p["metadata"]["annotations"].items() if a in BIND_ANNOTATIONS}
    assert set(written) == set(WRITTEN), written
    assert written["hami.io/vgpu-node"] == written["mthreads.com/predicate-node"] == SHARED
    assert written["hami.io/bind-phase"] == "allocating"  # "success" is the device plugin's, on a real node
    for annotation in WRITTEN:
        message = refused(annotate(cp, NS, "guarded", f"{annotation}=by-tenant", user=tenant(NS)), BY_POLICY)
        assert message.startswith(f"annotation {annotation} is written by hami-scheduler"), message
    refused(annotate(cp, NS, "guarded", "hami.io/bind-phase-", user=tenant(NS)), BY_POLICY)
    assert annotate(cp, NS, "guarded", "team=a", user=tenant(NS)).returncode == 0  # its rights are not the reason
    assert {a: v for a, v in stored(cp, NS, "guarded")["metadata"]["annotations"].items()
            if a in BIND_ANNOTATIONS} == written


def test_no_pod_the_webhook_admitted_was_refused_while_its_node_could_hold_it(cp):
    pods = json.loads(cp.kubectl("get", "pods", "-n", NS, "-l", f"{EXPECT}=bound", "-o", "json").stdout)["items"]
    assert len(pods) == 8 + 3 + 1 + 1 + 3 + 1
    for p in pods:
        name = p["metadata"]["name"]
        assert p["spec"].get("nodeName"), name
        refused = [(reason, m) for reason, m in events(cp, name) if reason in REFUSALS]
        assert refused == [], (name, refused)
    for p in json.loads(cp.kubectl("get", "pods", "-n", NS, "-l", f"{EXPECT}=pending", "-o", "json").stdout)["items"]:
        assert not p["spec"].get("nodeName"), p["metadata"]["name"]
    # HAMi refused one pod in the whole run: the one no card could hold.
    found = json.loads(cp.kubectl("get", "events", "-n", NS, "-o", "json").stdout)["items"]
    assert {e["involvedObject"]["name"] for e in found if e["reason"] in REFUSALS
            and HAMI_REASON.search(e["message"])} == {"split-whole"}
