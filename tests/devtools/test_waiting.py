"""devtools.waiting: the first truthy answer, or a failure that names what was awaited."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from devtools.waiting import NotWithin, seconds_until, until, until_async


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


def test_fail_makes_the_error_the_callers_catch() -> None:
    class Mine(Exception):
        pass

    with pytest.raises(Mine, match=r"^the socket: not within 0 s; end of its log$"):
        until("the socket", lambda: None, timeout=0.02, interval=0.01, fail=lambda m: Mine(f"{m}; end of its log"))


def test_a_probe_that_raises_ends_the_wait_at_once() -> None:
    def exited() -> bool:
        raise ValueError("the process exited")

    with pytest.raises(ValueError, match="exited"):
        until("the process ready", exited, timeout=60, interval=10)


def test_until_async_has_until_s_contract() -> None:
    answers: Iterator[object] = iter([None, "", "ready"])

    async def answer() -> object:
        return next(answers)

    assert asyncio.run(until_async("the answer", answer, timeout=5, interval=0)) == "ready"

    async def never() -> bool:
        return False

    with pytest.raises(NotWithin, match=r"^the configuration active: not within 0 s$"):
        asyncio.run(until_async("the configuration active", never, timeout=0.05, interval=0.01))
