"""Waiting for a condition with a deadline: the one polling loop of the tooling and the tests. Controllers,
kubelet and the API server act when they act; a wait says what it waited for when it gives up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["NotWithin", "seconds_until", "until"]

T = TypeVar("T")


class NotWithin(RuntimeError):
    """A condition that did not come within its deadline; the message names it and the deadline."""


def until(what: str, probe: Callable[[], T | None], timeout: float = 90.0, interval: float = 0.5) -> T:
    """`probe`'s first truthy answer, asked every `interval` seconds; `NotWithin` once `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        if result := probe():
            return result
        if time.monotonic() > deadline:
            raise NotWithin(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def seconds_until(what: str, probe: Callable[[], object], timeout: float = 90.0, interval: float = 0.5) -> float:
    """How long `until` waited: what a tier reports (a rollout, a renewal, a replica back)."""
    started = time.monotonic()
    until(what, probe, timeout, interval)
    return time.monotonic() - started
