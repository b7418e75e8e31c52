"""The HTTP handler: an AdmissionReview's bytes in, the answer out, with its metrics and log line.

The rules are not here: each body goes straight to `admission.review`, the same code `review` and
the tests use. What is here is what only a server has: the route, Content-Encoding, large bodies
decoded off the event loop, a bug turned into an answer, counters and one log line per decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp.web
import orjson
from aiohttp import hdrs

from ..admission import enforcement, review
from ..rules.decision import Decision
from ..rules.text import clip, quote
from .listener import GuardedHandler, Limits, Listener
from .state import State

logger = logging.getLogger("hami_mt_webhook")


class ReviewHandler:
    """Answers POST /{webhook}. `listener` is set once it exists, so answers while draining close the connection."""

    def __init__(self, state: State, limits: Limits) -> None:
        self.state = state
        self.limits = limits
        self.listener: Listener | None = None
        self._big_lane = asyncio.Semaphore(limits.big_concurrency)
        self._decoder = ThreadPoolExecutor(limits.big_concurrency, thread_name_prefix="decode")

    def close(self) -> None:
        self._decoder.shutdown(wait=False)

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        webhook = request.match_info["id"]
        base = review.route(webhook, self.state.config)[0]
        label = base if base in review.WEBHOOKS else "unknown"  # a label per random path would never end
        started = time.perf_counter()
        state = self.state
        encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
        if encoding not in ("", "identity"):  # the body is not read: a compressed review is refused whole
            state.metrics.bad_requests.labels(label).inc()
            response = aiohttp.web.json_response(
                {"error": f"Content-Encoding {quote(encoding)} is not supported; send the review uncompressed"},
                status=415)
            response.force_close()
            return response
        try:
            reply = await self._answer(request, webhook)
        except aiohttp.web.HTTPRequestEntityTooLarge:
            state.metrics.bad_requests.labels(label).inc()
            raise
        except Exception:  # a bug in the rules must still give the API server an answer, not a 500 trace
            logger.exception("review on /%s failed", webhook)
            reply = review.Reply(400, b'{"error":"the review could not be evaluated"}')
        state.metrics.review(label, reply.request, reply.decision, time.perf_counter() - started)
        decision = reply.decision
        if decision is not None and (decision.changes or not decision.allowed or decision.would_deny) \
                and logger.isEnabledFor(logging.INFO):
            try:
                log_decision(webhook, reply.request or {}, decision)
            except Exception:  # a log line must never cost an answer
                logger.exception("could not log a review on /%s", webhook)
        response = aiohttp.web.Response(status=reply.status, body=reply.body, content_type="application/json")
        if self.listener is not None and self.listener.draining:
            response.force_close()  # Connection: close, so the client does not reuse a closing connection
        return response

    async def _answer(self, request: aiohttp.web.Request, webhook: str) -> review.Reply:
        """Read and answer one review; a large body waits for the big lane and is decoded in a thread.

        Decoding a few MiB of JSON takes tens of milliseconds; on the event loop it would delay every
        other connection and the probes. Bodies of unknown length count as large.
        """
        state, protocol = self.state, request.protocol
        length = request.content_length
        if length is not None and length < self.limits.big_body:
            body = await request.read()
            if isinstance(protocol, GuardedHandler):
                protocol.request_read()
            return review.handle(body, webhook, state.view, state.config, state.quotas)
        async with self._big_lane:
            body = await request.read()
            if isinstance(protocol, GuardedHandler):
                protocol.request_read()
            if review.route(webhook, state.config)[0] not in review.WEBHOOKS:
                return review.handle_parsed({}, webhook, state.view, state.config, state.quotas)
            try:
                parsed = await asyncio.get_running_loop().run_in_executor(self._decoder, review.parse, body)
            except review.BadReview as err:
                return review.Reply(400, orjson.dumps({"error": str(err)}))
        return review.handle_parsed(parsed, webhook, state.view, state.config, state.quotas)


def log_decision(webhook: str, request: dict[str, Any], decision: Decision) -> None:
    """One structured line per denial and per mutation; allowed no-ops stay silent."""
    obj = _mapping(request.get("object"))
    meta = _mapping(obj.get("metadata"))
    kind = request.get("kind")
    extra = {"webhook": webhook, "namespace": _clipped(request.get("namespace") or meta.get("namespace")),
             "kind": _clipped(kind.get("kind")) if isinstance(kind, dict) else None,
             "object": _clipped(meta.get("name") or meta.get("generateName")), "uid": _clipped(request.get("uid")),
             "dry_run": bool(request.get("dryRun"))}
    if not decision.allowed:
        logger.info("denied: %s", decision.message, extra={**extra, "reason": decision.reason})
        return
    if decision.would_deny:  # rollout mode: the denial that `deny` would have answered
        shown = [w for w in decision.warnings if w.startswith(enforcement.WOULD_DENY)]
        logger.info("%s", "; ".join(shown), extra={**extra, "reason": ",".join(decision.would_deny)})
    if decision.changes:
        logger.info("mutated: %s", ", ".join(decision.mutations), extra={**extra, "warnings": decision.warnings})


def _mapping(value: Any) -> dict[str, Any]:
    """A field that should be an object; anything else a client sent reads as empty."""
    return value if isinstance(value, dict) else {}


def _clipped(value: Any) -> Any:
    """A request's value in a log field: strings cut to their first 64 characters, other shapes by type."""
    if isinstance(value, str):
        return clip(value)
    return value if value is None or isinstance(value, bool | int | float) else type(value).__name__
