"""The webhook service: kopf keeps the lifecycle, `nodewatch` the node view; aiohttp answers the reviews.

kopf logs in, handles signals and runs the webhook server it is given (`settings.admission.server`);
the node view is fed by its own streaming watch beside it (`nodewatch` says why). Reviews do not go
through kopf's generic admission machinery: the server hands each body straight to `review.handle`,
the same code `review` and the tests use.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import logging
import ssl
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
import orjson
from aiohttp import hdrs

from ..admission import review
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.quota import QuotaIndex
from ..rules.text import clip, quote
from . import certs, nodewatch, quotawatch
from .listener import GuardedHandler, Limits, Listener
from .metrics import Metrics

logger = logging.getLogger("hami_mt_webhook")

CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


@dataclass
class State:
    """What the handlers share: the node view, the quota index, the settings and the counters."""

    config: Config
    view: ClusterView = field(default_factory=lambda: ClusterView(ready=False))
    quotas: QuotaIndex = field(default_factory=QuotaIndex)
    metrics: Metrics = field(default_factory=Metrics)


def tls_context(certfile: str | Path, keyfile: str | Path, client_ca: str | Path | None = None) -> ssl.SSLContext:
    """TLS 1.2 at least (1.3 preferred), forward-secret AEAD ciphers, HTTP/1.1 only.

    No session tickets: their key would live as long as the process, and the API server keeps its
    connections open rather than resuming sessions.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_TICKET
    ctx.num_tickets = 0  # TLS 1.3 sends tickets unless told not to
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.load_cert_chain(str(certfile), str(keyfile))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(client_ca))
    return ctx


class AdmissionServer(kopf.WebhookServer):
    """kopf's webhook server, answering with the project's handler and reloading certificates in place.

    A certificate change builds a new SSL context that each new handshake switches to (through the
    SNI callback), so the listener is never restarted and in-flight connections are never dropped.
    """

    def __init__(self, state: State, *, addr: str = "0.0.0.0", port: int = 8443, certfile: str, pkeyfile: str,
                 cafile: str | None = None, client_ca: str | None = None, reload_interval: float = 10.0,
                 limits: Limits | None = None) -> None:
        super().__init__(addr=addr, port=port, certfile=certfile, pkeyfile=pkeyfile, cafile=cafile,
                         file_check_interval=reload_interval)
        self.state = state
        self.client_ca = client_ca
        self.limits = limits or Limits()
        self.listening = asyncio.Event()
        self.listener: Listener | None = None
        self._current: ssl.SSLContext | None = None
        self._digest = b""
        self._big_lane: asyncio.Semaphore | None = None
        self._decoder: ThreadPoolExecutor | None = None

    async def __call__(self, fn: Any = None) -> AsyncIterator[dict[str, str]]:
        """Serve until cancelled; yields the client config once (kopf's server protocol)."""
        context = self._load()
        app = aiohttp.web.Application(client_max_size=self.limits.max_body)
        app.router.add_post("/{id}", self._serve_review)
        metrics = self.state.metrics
        self.listener = listener = Listener(app, self.addr or "0.0.0.0", self.port or 0, context, self.limits,
                                            on_close=metrics.connection_closed)
        metrics.connections.set_function(lambda: listener.connections)
        self._big_lane = asyncio.Semaphore(self.limits.big_concurrency)
        self._decoder = decoder = ThreadPoolExecutor(self.limits.big_concurrency, thread_name_prefix="decode")
        await listener.start()
        try:
            self.port = listener.port
            logger.info("serving admission reviews on https://%s:%s", self.addr, self.port)
            self.listening.set()
            config: dict[str, str] = {"url": f"https://{self.addr}:{self.port}"}
            if self.cafile:
                config["caBundle"] = base64.b64encode(Path(self.cafile).read_bytes()).decode()
            yield config  # type: ignore[misc]
            while True:
                await asyncio.sleep(self.file_check_interval or 10.0)
                self._reload()
        finally:
            self.listening.clear()
            logger.info("draining: no new connections, finishing in-flight reviews")
            await asyncio.shield(listener.stop())
            decoder.shutdown(wait=False)

    def _files_digest(self) -> bytes:
        h = hashlib.sha256()
        for name in (self.certfile, self.pkeyfile, self.client_ca):
            if name:
                h.update(Path(name).read_bytes())
        return h.digest()

    def _load(self) -> ssl.SSLContext:
        self._digest = self._files_digest()
        self._current = tls_context(self.certfile, self.pkeyfile, self.client_ca)  # type: ignore[arg-type]
        self._current.sni_callback = self._pick_context
        self._note_expiry()
        return self._current

    def _pick_context(self, sslobj: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        if self._current is not None and sslobj.context is not self._current:
            sslobj.context = self._current
        return None

    def _reload(self) -> bool:
        """Load changed certificate files; keep serving the old ones if the new ones do not load."""
        try:
            digest = self._files_digest()
            if digest == self._digest:
                return False
            fresh = tls_context(self.certfile, self.pkeyfile, self.client_ca)  # type: ignore[arg-type]
        except (OSError, ssl.SSLError, ValueError) as err:
            logger.error("certificate files changed but do not load (%s); still serving the previous ones", err)
            self.state.metrics.cert_reloads.labels("failed").inc()
            return False
        fresh.sni_callback = self._pick_context
        self._current, self._digest = fresh, digest
        self._note_expiry()
        self.state.metrics.cert_reloads.labels("loaded").inc()
        logger.info("serving a renewed certificate from %s", self.certfile)
        return True

    def _note_expiry(self) -> None:
        try:
            self.state.metrics.cert_expiry.set(certs.expiry(Path(self.certfile)).timestamp())  # type: ignore[arg-type]
        except (OSError, ValueError):
            pass

    async def _answer(self, request: aiohttp.web.Request, webhook: str) -> review.Reply:
        """Read and answer one review; a large body waits for the big lane and is decoded in a thread.

        Decoding a few MiB of JSON takes tens of milliseconds; on the event loop it would delay every
        other connection and the probes. Bodies of unknown length count as large.
        """
        state, protocol = self.state, request.protocol
        length = request.content_length
        if length is not None and length < self.limits.big_body or self._big_lane is None:
            body = await request.read()
            if isinstance(protocol, GuardedHandler):
                protocol.request_read()
            return review.handle(body, webhook, state.view, state.config, state.quotas)
        async with self._big_lane:
            body = await request.read()
            if isinstance(protocol, GuardedHandler):
                protocol.request_read()
            if webhook not in review.WEBHOOKS:
                return review.handle_parsed({}, webhook, state.view, state.config, state.quotas)
            try:
                parsed = await asyncio.get_running_loop().run_in_executor(self._decoder, review.parse, body)
            except review.BadReview as err:
                return review.Reply(400, orjson.dumps({"error": str(err)}))
        return review.handle_parsed(parsed, webhook, state.view, state.config, state.quotas)

    async def _serve_review(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        webhook = request.match_info["id"]
        label = webhook if webhook in review.WEBHOOKS else "unknown"  # a label per random path would never end
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
        if decision is not None and (decision.patch or not decision.allowed) and logger.isEnabledFor(logging.INFO):
            try:
                _log(webhook, reply.request or {}, decision)
            except Exception:  # a log line must never cost an answer
                logger.exception("could not log a review on /%s", webhook)
        response = aiohttp.web.Response(status=reply.status, body=reply.body, content_type="application/json")
        if self.listener is not None and self.listener.draining:
            response.force_close()  # Connection: close, so the client does not reuse a closing connection
        return response


def _log(webhook: str, request: dict[str, Any], decision: Any) -> None:
    """One structured line per denial and per mutation; allowed no-ops stay silent."""
    obj = request.get("object") if isinstance(request.get("object"), dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    kind = request.get("kind")
    extra = {"webhook": webhook, "namespace": _clipped(request.get("namespace") or meta.get("namespace")),
             "kind": _clipped(kind.get("kind")) if isinstance(kind, dict) else None,
             "object": _clipped(meta.get("name") or meta.get("generateName")), "uid": _clipped(request.get("uid")),
             "dry_run": bool(request.get("dryRun"))}
    if not decision.allowed:
        logger.info("denied: %s", decision.message, extra={**extra, "reason": decision.reason})
    else:
        logger.info("mutated: %s", ", ".join(decision.mutations), extra={**extra, "warnings": decision.warnings})


def _clipped(value: Any) -> Any:
    """A request's value in a log field: strings cut to their first 64 characters, other shapes by type."""
    if isinstance(value, str):
        return clip(value)
    return value if value is None or isinstance(value, bool | int | float) else type(value).__name__


def register(registry: kopf.OperatorRegistry, state: State) -> None:
    """kopf's part: the login (for its own API discovery); Nodes are watched by `nodewatch`."""

    @kopf.on.login(id="login", registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
        return nodewatch.login(settings)


async def health_app(state: State) -> aiohttp.web.Application:
    """/readyz is ready once the node view has been synced (and stays so while the watch reconnects: see
    `nodewatch`); /livez only says the event loop answers."""

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        if state.view.ready:
            return aiohttp.web.Response(text=f"ready: {len(state.view)} sliced nodes\n")
        return aiohttp.web.Response(status=503, text="not ready: the node view is not synced yet\n")

    async def livez(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok\n")

    async def metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=state.metrics.render(),
                                    headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = aiohttp.web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", metrics)
    return app


async def run(state: State, server: AdmissionServer, *, health_addr: str, health_port: int,
              metrics_port: int | None, node_watch: str = "auto", node_selector: str | None = None) -> None:
    """Run kopf (login, webhook server, signals) with the node and quota watches and the probe and metrics
    listeners."""
    gc.freeze()  # modules and settings live as long as the process: no full collection need scan them
    registry = kopf.OperatorRegistry()
    register(registry, state)
    settings = kopf.OperatorSettings()
    settings.admission.server = server
    settings.admission.managed = None  # the webhook configurations are static manifests
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.peering.standalone = True
    feed = nodewatch.NodeFeed(state.view, state.config, state.metrics)
    watch = nodewatch.NodeWatch(feed, lambda: nodewatch.login(settings), mode=node_watch,
                                label_selector=node_selector)
    watcher = asyncio.create_task(_keep_watching(watch), name="node watch")
    quotas = quotawatch.quota_watch(state.quotas, state.config, lambda: nodewatch.login(settings), mode=node_watch)
    quota_watcher = asyncio.create_task(_keep_watching(quotas), name="quota watch")
    runners = []
    try:
        app = await health_app(state)
        runner = aiohttp.web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await aiohttp.web.TCPSite(runner, health_addr, health_port).start()
        if metrics_port and metrics_port != health_port:
            await aiohttp.web.TCPSite(runner, health_addr, metrics_port).start()
        await kopf.operator(registry=registry, settings=settings, standalone=True, clusterwide=True)
    finally:
        watcher.cancel()
        quota_watcher.cancel()
        for runner in runners:
            await runner.cleanup()


async def _keep_watching(watch: nodewatch.NodeWatch) -> None:
    """The watch retries API errors itself; this restarts it after anything else, so the view never freezes."""
    while True:
        try:
            await watch.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the %s failed; restarting it in 1 s", watch.what)
            await asyncio.sleep(1.0)
