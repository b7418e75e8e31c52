"""The failover judgement: most replicas must agree, the last ready one is never marked, a silent one
that answers again is put back; a lossy one is judged as a silent one, by voters that still probe someone
cleanly, and put back only after a clean window."""

from __future__ import annotations

import pytest

from hami_mt_webhook.service.failover.peerview import (
    CONDITION,
    MIN_PROBES,
    Outcomes,
    Replica,
    Timing,
    View,
    disputed,
    judge,
    replica,
)

T = Timing(silent_after=0.75, recover_after=1.0)


def members(*names: str, answering: bool | None = True, ready: bool = True) -> dict[str, Replica]:
    return {n: Replica(n, f"10.244.0.{i + 10}", ready=ready, answering=answering) for i, n in enumerate(names)}


def view(name: str, heard: dict[str, float], failing: dict[str, float] | None = None) -> View:
    return View(name, heard, frozenset(n for n, s in heard.items() if s >= T.silent_after), failing or {})


def test_a_replica_most_do_not_hear_is_marked_not_answering() -> None:
    rs = members("a", "b", "c")
    verdicts = judge("a", rs, {"b": 0.1, "c": 0.9}, {"b": 5.0}, {"b": view("b", {"a": 0.1, "c": 0.8})}, T)
    assert [(v.name, v.answering, v.agreed, v.of) for v in verdicts] == [("c", False, 2, 3)]


def test_one_replica_alone_cannot_mark_another() -> None:
    rs = members("a", "b", "c")
    # a does not hear c, but b does (a is cut off from c, or c from a): no majority.
    assert judge("a", rs, {"b": 0.1, "c": 5.0}, {}, {"b": view("b", {"a": 0.1, "c": 0.1})}, T) == []
    assert disputed("a", rs, {"b": 0.1, "c": 5.0}, {"b": view("b", {"a": 0.1, "c": 0.1})}, T) == ["c"]


def test_a_replica_cut_off_from_all_marks_nobody() -> None:
    rs = members("a", "b", "c")
    # a hears nobody and has no fresh view of anyone (their views are dropped when they go silent)
    assert judge("a", rs, {"b": 3.0, "c": 3.0}, {}, {}, T) == []
    assert disputed("a", rs, {"b": 3.0, "c": 3.0}, {}, T) == ["b", "c"]


def test_silence_shorter_than_silent_after_is_no_verdict() -> None:
    rs = members("a", "b", "c")
    assert judge("a", rs, {"b": 0.1, "c": 0.7}, {}, {"b": view("b", {"c": 0.9})}, T) == []


def test_the_last_ready_replica_is_never_marked() -> None:
    rs = {**members("a", "c", answering=False, ready=False), "b": Replica("b", "10.244.0.11", True, True)}
    # b is the only one still ready: even with a majority (a and c agree) it stays
    assert judge("a", rs, {"b": 2.0, "c": 0.1}, {}, {"c": view("c", {"a": 0.1, "b": 2.0})}, T) == []
    # with a ready too, b goes
    rs["a"] = Replica("a", "10.244.0.10", ready=True, answering=True)
    verdicts = judge("a", rs, {"b": 2.0, "c": 0.1}, {}, {"c": view("c", {"a": 0.1, "b": 2.0})}, T)
    assert [(v.name, v.answering) for v in verdicts] == [("b", False)]


def test_with_two_replicas_no_majority_is_possible() -> None:
    rs = members("a", "b")
    assert judge("a", rs, {"b": 9.0}, {}, {}, T) == []


def test_five_replicas_need_three() -> None:
    rs = members("a", "b", "c", "d", "e")
    heard = {"b": 0.1, "c": 0.1, "d": 0.1, "e": 2.0}
    one = {"b": view("b", {"e": 2.0}), "c": view("c", {"e": 0.1}), "d": view("d", {"e": 0.1})}
    assert judge("a", rs, heard, {}, one, T) == []
    two = {**one, "c": view("c", {"e": 2.0})}
    assert [(v.name, v.agreed, v.of) for v in judge("a", rs, heard, {}, two, T)] == [("e", 3, 5)]


def test_a_replica_that_answers_again_is_put_back_once_most_hear_it() -> None:
    rs = {**members("a", "b"), "c": Replica("c", "10.244.0.12", ready=False, answering=False)}
    heard = {"b": 0.1, "c": 0.1}
    # answering for 0.5 s only: not yet
    assert judge("a", rs, heard, {"c": 0.5}, {"b": view("b", {"c": 0.1})}, T) == []
    verdicts = judge("a", rs, heard, {"c": 1.2}, {"b": view("b", {"c": 0.1})}, T)
    assert [(v.name, v.answering, v.agreed) for v in verdicts] == [("c", True, 2)]
    # b still does not hear it: no majority for putting it back
    assert judge("a", rs, heard, {"c": 1.2}, {"b": view("b", {"c": 3.0})}, T) == []


def test_the_last_replica_vouches_for_itself() -> None:
    rs = {"a": Replica("a", "10.244.0.10", ready=False, answering=False),
          "b": Replica("b", "10.244.0.11", ready=False, answering=None)}
    verdicts = judge("a", rs, {"b": 4.0}, {}, {}, T)
    assert [(v.name, v.answering) for v in verdicts] == [("a", True)]


def test_pods_being_deleted_and_unset_gates_are_left_alone() -> None:
    rs = {**members("a", "b"), "c": Replica("c", "10.244.0.12", ready=False, answering=None),
          "d": Replica("d", "10.244.0.13", ready=True, answering=True, deleting=True)}
    views = {"b": view("b", {"c": 3.0, "d": 3.0})}
    # c has not vouched for itself yet (starting); d is going away: neither is marked, and d does not vote
    assert judge("a", rs, {"b": 0.1, "c": 3.0, "d": 3.0}, {}, views, T) == []


@pytest.mark.parametrize(("gate", "expected"), [("True", True), ("False", False), (None, None)])
def test_replica_reads_the_pod(gate: str | None, expected: bool | None) -> None:
    conditions = [{"type": "Ready", "status": "True"}]
    if gate is not None:
        conditions.append({"type": CONDITION, "status": gate})
    pod = {"metadata": {"name": "w-1"}, "status": {"podIP": "10.244.1.10", "conditions": conditions}}
    assert replica(pod) == Replica("w-1", "10.244.1.10", ready=True, answering=expected)
    assert replica({"metadata": {"name": "w-2"}, "status": {}}) is None


def test_a_view_survives_its_wire_form_and_refuses_garbage() -> None:
    v = view("a", {"b": 0.25, "c": 1.5})
    assert View.from_json(v.to_json()) == v
    bads: tuple[object, ...] = (None, [], {"heard": {}}, "a")
    for bad in bads:
        with pytest.raises(ValueError):
            View.from_json(bad)
    odd = View.from_json({"name": "x", "heard": {"b": "soon"}, "silent": "c"})
    assert odd == View("x", {}, frozenset())


def test_a_refused_connection_is_enough_alone_but_never_for_the_last_ready_replica() -> None:
    """Its host's kernel said nothing listens: a replica cut off could not have been told that."""
    rs = members("a", "b", "c")
    verdicts = judge("a", rs, {"b": 0.1, "c": 0.2}, {}, {"b": view("b", {"c": 0.1})}, T, refused={"c"})
    assert [(v.name, v.answering, v.agreed) for v in verdicts] == [("c", False, 1)]
    alone = {"a": Replica("a", "10.244.0.10", ready=False, answering=False), "c": rs["c"]}
    assert judge("a", alone, {"c": 0.2}, {}, {}, T, refused={"c"}) == []


def test_a_marked_replica_ready_again_before_its_kubelet_saw_the_gate_is_marked_again() -> None:
    """kubelet's periodic reconcile writes its cached Ready back over a verdict's Ready False; while the
    replica is still refused or silent, the verdict is written again. Ready False with it is the state to
    keep: no verdict."""
    undone = {**members("a", "b"), "c": Replica("c", "10.244.0.12", ready=True, answering=False)}
    verdicts = judge("a", undone, {"b": 0.1, "c": 0.2}, {}, {}, T, refused={"c"})
    assert [(v.name, v.answering) for v in verdicts] == [("c", False)]
    verdicts = judge("a", undone, {"b": 0.1, "c": 0.9}, {}, {"b": view("b", {"a": 0.1, "c": 0.8})}, T)
    assert [(v.name, v.answering, v.agreed) for v in verdicts] == [("c", False, 2)]
    kept = {**members("a", "b"), "c": Replica("c", "10.244.0.12", ready=False, answering=False)}
    assert judge("a", kept, {"b": 0.1, "c": 0.2}, {}, {}, T, refused={"c"}) == []


def test_outcomes_give_a_share_over_the_window_once_there_are_enough() -> None:
    o = Outcomes(window=5.0)
    for i in range(MIN_PROBES - 1):
        o.add(i * 0.1, failed=i % 4 == 0)
    assert o.share(1.9) is None  # too few to say anything
    o.add(1.9, failed=False)
    assert o.share(1.9) == pytest.approx(5 / MIN_PROBES)
    # five seconds on, the failures have left the window with the rest
    for i in range(MIN_PROBES):
        o.add(7.0 + i * 0.1, failed=False)
    assert o.share(9.0) == 0.0


def test_a_lossy_replica_most_probe_badly_is_marked_with_its_share_as_the_reason() -> None:
    rs = members("a", "b", "c")
    heard = {"b": 0.05, "c": 0.3}  # c answers often enough never to be silent
    views = {"b": view("b", {"a": 0.05, "c": 0.2}, {"a": 0.0, "c": 0.41})}
    verdicts = judge("a", rs, heard, {"b": 5.0}, views, T, failing={"b": 0.02, "c": 0.38})
    assert [(v.name, v.answering, v.agreed, v.reason) for v in verdicts] == [
        ("c", False, 2, "lost 38 % of probes over 5 s")]
    # under the share (or before a window is full) it is no verdict
    assert judge("a", rs, heard, {"b": 5.0}, views, T, failing={"b": 0.02, "c": 0.2}) == []
    assert judge("a", rs, heard, {"b": 5.0}, views, T, failing={"b": 0.02}) == []


def test_a_replica_behind_a_lossy_link_sees_everyone_lossy_and_is_not_counted() -> None:
    """c's link loses packets: a and b lose its probes, and c loses theirs. a and b mark c; c's word
    against them does not count."""
    rs = members("a", "b", "c")
    lossy_c = {"c": view("c", {"a": 0.2, "b": 0.2}, {"a": 0.4, "b": 0.45})}
    views_at_a = {**lossy_c, "b": view("b", {"a": 0.05, "c": 0.2}, {"a": 0.0, "c": 0.4})}
    verdicts = judge("a", rs, {"b": 0.05, "c": 0.2}, {}, views_at_a, T, failing={"b": 0.0, "c": 0.4})
    assert [(v.name, v.agreed) for v in verdicts] == [("c", 2)]
    # from c's side: it loses the probes of both, so it marks nobody, and says it disagrees
    seen_by_c = {"a": view("a", {"b": 0.05, "c": 0.2}, {"b": 0.0, "c": 0.4}),
                 "b": view("b", {"a": 0.05, "c": 0.2}, {"a": 0.0, "c": 0.42})}
    assert judge("c", rs, {"a": 0.2, "b": 0.2}, {}, seen_by_c, T, failing={"a": 0.4, "b": 0.45}) == []
    assert disputed("c", rs, {"a": 0.2, "b": 0.2}, seen_by_c, T, failing={"a": 0.4, "b": 0.45}) == ["a", "b"]
    # and a voter that loses everyone's probes does not make a majority against a healthy replica
    assert judge("b", rs, {"a": 0.05, "c": 0.2}, {}, {"c": lossy_c["c"]}, T, failing={"a": 0.3, "c": 0.4}) == []


def test_a_lossy_replica_comes_back_only_after_a_clean_window() -> None:
    """Hysteresis: a link down 1 s in 3 answers for 2 s at a time, but its share stays high."""
    rs = {**members("a", "b"), "c": Replica("c", "10.244.0.12", ready=False, answering=False)}
    heard = {"b": 0.05, "c": 0.05}
    clean_b = {"b": view("b", {"c": 0.05}, {"c": 0.0})}
    assert judge("a", rs, heard, {"c": 2.0}, clean_b, T, failing={"c": 0.33}) == []
    assert judge("a", rs, heard, {"c": 2.0}, clean_b, T, failing={"c": 0.06}) == []
    verdicts = judge("a", rs, heard, {"c": 2.0}, clean_b, T, failing={"c": 0.02})
    assert [(v.name, v.answering, v.agreed) for v in verdicts] == [("c", True, 2)]
    # b still loses a third of them: no majority for putting it back
    lossy_b = {"b": view("b", {"c": 0.05}, {"c": 0.3})}
    assert judge("a", rs, heard, {"c": 2.0}, lossy_b, T, failing={"c": 0.02}) == []


def test_a_view_carries_its_failure_shares_and_an_old_one_reads_without() -> None:
    v = view("a", {"b": 0.25, "c": 1.5}, {"b": 0.125, "c": 1.0})
    assert View.from_json(v.to_json()) == v
    assert View.from_json({"name": "a", "heard": {"b": 0.1}, "silent": []}).failing == {}
    assert View.from_json({"name": "a", "failing": {"b": 7, "c": "x"}}).failing == {"b": 1.0}
