"""Node reports, per-card capacity and candidate nodes (SPEC.md §2)."""

import logging

import pytest

from hami_mt_webhook.rules.capacity import ClusterView, NodeReport, OncePerNode, report
from hami_mt_webhook.rules.config import Config

CFG = Config()


def node(name, core=None, memory=None, labels=None):
    capacity = {"cpu": "8"}
    if core is not None:
        capacity["mthreads.com/sgpu-core"] = core
    if memory is not None:
        capacity["mthreads.com/sgpu-memory"] = memory
    return {"metadata": {"name": name, "labels": labels or {}}, "status": {"capacity": capacity}}


@pytest.mark.parametrize(("core", "memory", "cards", "per_card"), [
    ("16", "96", 1, 96), ("128", "1280", 8, 160), ("32", "192", 2, 96)])
def test_per_card_capacity_comes_from_the_node(core, memory, cards, per_card):
    r = report(node("n", core, memory), CFG)
    assert r is not None and (r.cards, r.per_card) == (cards, per_card)


@pytest.mark.parametrize(("core", "memory"), [
    (None, None), ("0", "96"), ("15", "96"), ("16", "1"), ("16", "0"), ("abc", "96"), ("16", "lots")])
def test_nodes_without_a_usable_sliced_report_are_skipped(core, memory, caplog):
    with caplog.at_level(logging.WARNING):
        assert report(node("odd", core, memory), CFG) is None


def test_a_node_with_garbage_everywhere_does_not_crash():
    assert report({"metadata": None, "status": {"capacity": ["x"]}}, CFG) is None
    assert report({}, CFG) is None


S4 = NodeReport("a", {"model": "s4000", "zone": "1", "rank": "5"}, 1, 96)
S5 = NodeReport("b", {"model": "s5000", "zone": "2", "rank": "10"}, 8, 160)


def affinity(*terms):
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def expr(key, op, *values):
    e = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return {"matchExpressions": [e]}


@pytest.mark.parametrize(("spec", "caps"), [
    ({}, {96, 160}),
    ({"nodeSelector": {"model": "s4000"}}, {96}),
    ({"nodeSelector": {"model": "s4000", "zone": "2"}}, {96}),  # matches nothing: memoryPerCard fallback
    (affinity(expr("model", "In", "s5000")), {160}),
    (affinity(expr("model", "NotIn", "s5000")), {96}),
    (affinity(expr("zone", "Exists")), {96, 160}),
    (affinity(expr("zone", "DoesNotExist")), {96}),
    (affinity(expr("rank", "Gt", "7")), {160}),
    (affinity(expr("rank", "Lt", "7")), {96}),
    (affinity(expr("model", "In", "s4000"), expr("model", "In", "s5000")), {96, 160}),  # terms are ORed
    (affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}), {160}),
    (affinity({}), {96}),  # an empty term selects nothing
])
def test_candidates_follow_node_selector_and_required_affinity(spec, caps):
    assert ClusterView([S4, S5]).candidates(spec, CFG).capacities == frozenset(caps)


def test_fallback_to_memory_per_card_when_nothing_reports():
    c = ClusterView().candidates({}, Config(memory_per_card=(96, 160)))
    assert c.capacities == frozenset({96, 160}) and c.max_cards is None and not c.from_nodes


def test_updates_and_removals_keep_the_summary_right():
    view = ClusterView([S4, S5])
    assert view.candidates({}, CFG).max_cards == 8
    view.remove("b")
    assert view.candidates({}, CFG).capacities == frozenset({96})
    view.upsert(NodeReport("a", S4.labels, 4, 160))  # the node was re-sliced
    c = view.candidates({}, CFG)
    assert (c.capacities, c.max_cards, len(view)) == (frozenset({160}), 4, 1)
    view.remove("a")
    view.remove("missing")
    assert view.candidates({}, CFG).capacities == frozenset({96})


def test_from_nodes_skips_non_sliced_nodes():
    view = ClusterView.from_nodes([node("a", "16", "96"), node("b"), node("c", "128", "1280")], CFG)
    assert sorted(n.name for n in view) == ["a", "c"]


def test_answers_for_a_constraint_are_remembered_until_a_node_changes():
    view = ClusterView([S4, S5])
    spec = {"nodeSelector": {"model": "s4000"}}
    first = view.candidates(spec, CFG)
    assert view.candidates({"nodeSelector": {"model": "s4000"}}, CFG) is first  # same constraint, same answer
    view.upsert(S4)  # unchanged report: nothing to forget
    assert view.candidates(spec, CFG) is first
    view.upsert(NodeReport("c", {"model": "s4000"}, 2, 128))
    assert view.candidates(spec, CFG).capacities == frozenset({96, 128})
    view.remove("c")
    assert view.candidates(spec, CFG).capacities == frozenset({96})


@pytest.mark.parametrize("selector", [{"model": ["s4000"]}, {"model": None}, {1: "x"}, {"model": {"a": 1}}])
def test_odd_selectors_match_nothing_and_never_raise(selector):
    assert ClusterView([S4, S5]).candidates({"nodeSelector": selector}, CFG).from_nodes is False


def test_holding_narrows_to_nodes_that_slice_enough_cards():
    view = ClusterView([NodeReport("a", {}, 8, 96), NodeReport("b", {}, 1, 160), NodeReport("c", {}, 2, 160)])
    every = view.candidates({}, CFG)
    assert every.capacities == frozenset({96, 160}) and every.max_cards == 8
    assert every.holding(1) is every and every.holding(2) is every
    three = every.holding(3)
    assert (three.capacities, three.max_cards, three.most_cards) == (frozenset({96}), 8, ((96, 8),))
    pinned = view.candidates({"nodeSelector": {}}, CFG)  # an empty selector constrains nothing
    assert pinned == every


def test_holding_keeps_the_fallback_when_nothing_reports():
    fallback = ClusterView().candidates({}, Config(memory_per_card=(96, 160)))
    assert fallback.holding(4) is fallback


def test_a_warning_is_logged_once_per_node_until_it_changes_or_is_forgotten(caplog):
    log = logging.getLogger("tests.once")
    once = OncePerNode(log, limit=2)
    with caplog.at_level(logging.WARNING, logger="tests.once"):
        for message in ("odd", "odd", "odder", "odder"):
            once.warn("a", message)
        once.forget("a")
        once.warn("a", "odder")
        once.warn("b", "odd")
        once.keep({"b"})
        assert len(once) == 1
        once.warn("b", "odd")
        once.warn("c", "odd")
        once.warn("d", "odd")  # past the limit everything is forgotten
        once.warn("b", "odd")
    assert [r.getMessage() for r in caplog.records] == ["odd", "odder", "odder", "odd", "odd", "odd", "odd"]
