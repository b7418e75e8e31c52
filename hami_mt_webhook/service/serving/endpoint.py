"""The admission endpoint: an AdmissionReview's bytes in, the answer out, with its metrics and log line.

The rules are not here: each body goes straight to `admission.review`, the same code `review` and
the tests use. What is here is what only a server has: Content-Encoding, large bodies decoded off the
event loop, a bug turned into an answer, counters and one log line per decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from ...admission import enforcement, review
from ...rules.decision import Decision
from ...rules.text import clip, quote
from .. import logs
from ..state import State
from .connections import Limits
from .http11 import Answer, Head, parse_head

__all__ = ["log_decision"]

logger = logging.getLogger("hami_mt_webhook")


class ReviewEndpoint:
    """Answers POST /{webhook}: small bodies on the event loop, large ones decoded in a thread."""

    allow = b"POST"
    parse = staticmethod(parse_head)

    def __init__(self, state: State, limits: Limits) -> None:
        self.state = state
        self.limits = limits
        self.big_lane = asyncio.Semaphore(limits.big_concurrency)
        self._decoder = ThreadPoolExecutor(limits.big_concurrency, thread_name_prefix="decode")

    def close(self) -> None:
        self._decoder.shutdown(wait=False)

    def answer(self, head: Head, body: bytes) -> Answer:
        """A review whose body has been read whole."""
        started = time.perf_counter()
        refused = self._refuse_encoding(head)
        if refused is not None:
            return refused
        state = self.state
        routed = review.route(head.webhook, state.config)
        try:
            reply = review.handle_routed(body, routed, state.view, state.quotas)
        except Exception:  # a bug in the rules must still give the API server an answer, not a 500 trace
            logger.exception("review on /%s failed", head.webhook)
            reply = FAILED
        return self._done(head.webhook, routed, reply, started)

    async def answer_big(self, head: Head, body: bytes) -> Answer:
        """A large review (`Limits.big_body`): decoding a few MiB of JSON takes tens of milliseconds, and on
        the event loop it would delay every other connection and the probes."""
        started = time.perf_counter()
        refused = self._refuse_encoding(head)
        if refused is not None:
            return refused
        state, webhook = self.state, head.webhook
        routed = review.route(webhook, state.config)
        _, handler, _ = routed
        try:
            if handler is None:
                reply = review.handle_parsed({}, routed, state.view, state.quotas)
            else:
                try:
                    loop = asyncio.get_running_loop()
                    parsed = await loop.run_in_executor(self._decoder, review.parse, body)
                except review.BadReview as err:
                    reply = review.Reply(400, orjson.dumps({"error": str(err)}))
                else:
                    reply = review.handle_parsed(parsed, routed, state.view, state.quotas)
        except Exception:
            logger.exception("review on /%s failed", webhook)
            reply = FAILED
        return self._done(webhook, routed, reply, started)

    def refused(self, head: Head, status: int) -> None:
        """A request the connection refused before its body was read (413: over `Limits.max_body`)."""
        self.state.metrics.bad_requests.labels(_label(review.route(head.webhook, self.state.config))).inc()

    def _refuse_encoding(self, head: Head) -> Answer | None:
        """A compressed review is refused whole (SPEC.md §6), and the connection closed."""
        if head.encoding in ("", "identity"):
            return None
        self.refused(head, 415)
        message = f"Content-Encoding {quote(head.encoding)} is not supported; send the review uncompressed"
        return Answer(415, orjson.dumps({"error": message}), close=True)

    def _done(self, webhook: str, routed: review.Route, reply: review.Reply, started: float) -> Answer:
        """Count the review, log its decision, and hand back the answer."""
        elapsed = time.perf_counter() - started
        self.state.metrics.review(_label(routed), reply.request, reply.decision, elapsed)
        decision = reply.decision
        if decision is not None and (decision.changes or not decision.allowed or decision.would_deny) \
                and logger.isEnabledFor(logging.INFO):
            try:
                log_decision(webhook, reply.request or {}, decision)
            except Exception:  # a log line must never cost an answer
                logger.exception("could not log a review on /%s", webhook)
        return Answer(reply.status, reply.body)


#: The answer when the rules fail on a review: a bug, logged with its trace, never a 500 with one.
FAILED = review.Reply(400, b'{"error":"the review could not be evaluated"}')


def _label(routed: review.Route) -> str:
    """A review's metrics label: its handler id, or `unknown` (a label per random path would never end)."""
    webhook, handler, _ = routed
    return webhook if handler is not None else "unknown"


def log_decision(webhook: str, request: dict[str, Any], decision: Decision) -> None:
    """One structured line per denial and per mutation; allowed no-ops stay silent."""
    obj = _mapping(request.get("object"))
    meta = _mapping(obj.get("metadata"))
    kind = request.get("kind")
    extra = {"webhook": webhook, "namespace": _clipped(request.get("namespace") or meta.get("namespace")),
             "kind": _clipped(kind.get("kind")) if isinstance(kind, dict) else None,
             "object": _clipped(meta.get("name") or meta.get("generateName")),
             "uid": _clipped(request.get("uid")),
             "dry_run": bool(request.get("dryRun"))}
    if not decision.allowed:
        logs.decision(logger, f"denied: {decision.message}", {**extra, "reason": decision.reason})
        return
    if decision.would_deny:  # rollout mode: the denial that `deny` would have answered
        shown = [w for w in decision.warnings if w.startswith(enforcement.WOULD_DENY)]
        logs.decision(logger, "; ".join(shown), {**extra, "reason": ",".join(decision.would_deny)})
    if decision.changes:
        logs.decision(logger, f"mutated: {', '.join(decision.mutations)}",
                      {**extra, "warnings": decision.warnings})


def _mapping(value: Any) -> dict[str, Any]:
    """A field that should be an object; anything else a client sent reads as empty."""
    return value if isinstance(value, dict) else {}


def _clipped(value: Any) -> Any:
    """A request's value in a log field: strings cut to their first 64 characters, other shapes by type."""
    if isinstance(value, str):
        return clip(value)
    return value if value is None or isinstance(value, bool | int | float) else type(value).__name__
