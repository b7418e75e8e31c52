"""devtools.waiting: the first truthy answer, or a failure that names what was awaited."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from devtools.waiting import NotWithin, seconds_until, until


def test_the_first_truthy_answer_is_returned() -> None:
    answers: Iterator[object] = iter([None, 0, [], "ready"])
    assert until("the answer", lambda: next(answers), timeout=5, interval=0) == "ready"


def test_a_condition_that_never_comes_is_named_with_its_deadline() -> None:
    tries = itertools.count()
    with pytest.raises(NotWithin, match=r"^the replica Ready: not within 0 s$"):
        until("the replica Ready", lambda: next(tries) < 0, timeout=0.05, interval=0.01)
    assert next(tries) >= 2  # asked more than once before giving up


def test_seconds_until_says_how_long_it_waited() -> None:
    answers = iter([False, False, True])
    took = seconds_until("the third answer", lambda: next(answers), timeout=5, interval=0.02)
    assert 0.04 <= took < 1
