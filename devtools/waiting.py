"""Waiting for a condition with a deadline: the one polling loop of the tooling and the tests. Controllers,
kubelet and the API server act when they act; a wait says what it waited for when it gives up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["NotWithin", "seconds_until", "until", "until_async"]

T = TypeVar("T")


class NotWithin(RuntimeError):
    """A condition that did not come within its deadline; the message names it and the deadline."""


def until(what: str, probe: Callable[[], T | None], timeout: float = 90.0, interval: float = 0.5, *,
          fail: Callable[[str], Exception] = NotWithin) -> T:
    """`probe`'s first truthy answer, asked every `interval` seconds; once `timeout` has passed, `fail` of the
    message naming `what` and the deadline is raised: `NotWithin`, or the error a caller's callers catch, with
    what only the caller knows then (a log's tail, the last answer). A probe that sees the wait is hopeless (its
    process exited) raises at once."""
    deadline = time.monotonic() + timeout
    while True:
        if result := probe():
            return result
        if time.monotonic() > deadline:
            raise fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


async def until_async(what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 90.0,
                      interval: float = 0.5, *, fail: Callable[[str], Exception] = NotWithin) -> T:
    """`until` for a probe that is a coroutine, sleeping on the event loop: the benches' clients are async."""
    deadline = time.monotonic() + timeout
    while True:
        if result := await probe():
            return result
        if time.monotonic() > deadline:
            raise fail(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(interval)


def seconds_until(what: str, probe: Callable[[], object], timeout: float = 90.0, interval: float = 0.5) -> float:
    """How long `until` waited: what a tier reports (a rollout, a renewal, a replica back)."""
    started = time.monotonic()
    until(what, probe, timeout, interval)
    return time.monotonic() - started
