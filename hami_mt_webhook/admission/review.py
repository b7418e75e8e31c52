"""AdmissionReview in, AdmissionReview out: the one seam the server, the CLI and the tests share.

The webhooks table maps each URL path to a handler (admission.pod_webhooks, admission.workloads), each
under the configured enforcement (admission.enforcement); `/warn/<id>` answers under `warn` (SPEC.md
§4.10). A decision's changes keep tuple paths until `respond` writes them as the response's JSON Patch.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias

import orjson

from ..rules import quota
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision
from ..rules.text import quote
from . import enforcement
from .enforcement import admit, admit_pod
from .pod_webhooks import Handler
from .workloads import decide_workload, kind_of, workload_kind

__all__ = ["WARN_PREFIX", "BadReview", "Reply", "Route", "admit_review", "admit_pod", "handle", "handle_parsed",
           "handle_routed", "parse", "route", "warned"]

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
REASONS = {400: "BadRequest", 403: "Forbidden", 503: "ServiceUnavailable"}


class BadReview(ValueError):
    """The body is not an AdmissionReview the webhook can answer; the server replies HTTP 400."""


def parse(body: bytes) -> dict[str, Any]:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadReview(f"the body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise BadReview("the body is not an AdmissionReview object")
    return review


def request_of(review: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The review's request and uid, or BadReview when there is nothing to answer to."""
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the AdmissionReview request has no uid")
    return request, uid


#: Handler ids; the webhook configurations call https://<service>/<id>. The pod webhooks answer under the
#: configured enforcement (admission.enforcement).
WEBHOOKS: dict[str, Handler] = {
    "mutate-pods": enforcement.mutate_step,
    "validate-pods": enforcement.validate_step,
    "validate-workloads": decide_workload,
}


#: Paths under this prefix (`/warn/mutate-pods`, ...) answer under `warn` whatever the server's enforcement:
#: the webhook configurations send them the requests of namespaces labelled `hami.io/enforcement: warn`
#: (§4.10).
WARN_PREFIX = "warn/"


#: What a request's path names, resolved once per request (the server labels its metrics with it too):
#: the handler id without `warn/`, its handler (None: no such webhook, a 404) and the settings to answer
#: with (`warn` under /warn/). A plain tuple, as one is made for every review.
Route: TypeAlias = tuple[str, Handler | None, Config]


def route(webhook: str, config: Config) -> Route:
    """The handler a path names, and the settings to answer it with."""
    if webhook.startswith(WARN_PREFIX):
        webhook, config = webhook[len(WARN_PREFIX):], warned(config)
    return webhook, WEBHOOKS.get(webhook), config


@lru_cache(maxsize=8)
def warned(config: Config) -> Config:
    """`config` under `warn`; cached, as it is asked for on every review of a namespace in warn."""
    if config.enforcement == enforcement.WARN:
        return config
    return dataclasses.replace(config, enforcement="warn")


def respond(uid: str, decision: Decision, api_version: Any = None) -> dict[str, Any]:
    """The AdmissionReview a webhook returns for `decision`."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code, "message": decision.message,
                              "reason": REASONS.get(decision.code, "Forbidden")}
    if decision.warnings:
        response["warnings"] = decision.warnings
    if decision.changes:  # tuple paths until here: the one place they are written as JSON Patch
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(decision.patch)).decode("ascii")
    return {"apiVersion": api_version if api_version in API_VERSIONS else API_VERSIONS[0],
            "kind": "AdmissionReview", "response": response}


@dataclass
class Reply:
    """What the HTTP layer sends back, with what it needs for metrics and logs."""

    status: int
    body: bytes
    decision: Decision | None = None
    request: dict[str, Any] | None = None


def handle(body: bytes, webhook: str, view: ClusterView, config: Config,
           quotas: quota.QuotaIndex | None = None) -> Reply:
    """The HTTP seam: status code and body for a POST to /<webhook>."""
    return handle_routed(body, route(webhook, config), view, quotas)


def handle_routed(body: bytes, routed: Route, view: ClusterView,
                  quotas: quota.QuotaIndex | None = None) -> Reply:
    """`handle` for a path already routed: the server routes each request once, and counts it under
    the route."""
    try:
        review = parse(body) if routed[1] is not None else {}  # a 404 needs no body
    except BadReview as err:
        return Reply(400, orjson.dumps({"error": str(err)}))
    return handle_parsed(review, routed, view, quotas)


def handle_parsed(review: dict[str, Any], routed: Route, view: ClusterView,
                  quotas: quota.QuotaIndex | None = None) -> Reply:
    """`handle_routed` for a body already decoded with `parse` (the server decodes large bodies in a
    thread)."""
    webhook, handler, config = routed
    if handler is None:
        known = ", ".join(WEBHOOKS)
        return Reply(404, orjson.dumps({"error": f"no webhook {quote(webhook)}; known: {known}"}))
    try:
        request, uid = request_of(review)
        decision = handler(request, view, config)
    except BadReview as err:
        return Reply(400, orjson.dumps({"error": str(err)}))
    if webhook == "mutate-pods":
        quota_warnings(request, decision, quotas, config)
    return Reply(200, orjson.dumps(respond(uid, decision, review.get("apiVersion"))), decision, request)


def quota_warnings(request: dict[str, Any], decision: Decision, quotas: quota.QuotaIndex | None,
                   config: Config) -> None:
    """§4.9, once per pod (by the mutating webhook): the namespace's quotas that Kubernetes does not
    enforce."""
    if quotas is None or request.get("operation") != "CREATE" or request.get("subResource") \
            or kind_of(request) not in (None, "Pod"):
        return
    namespace = request.get("namespace")
    if isinstance(namespace, str):
        decision.warnings.extend(quota.warnings(request.get("object"), quotas.get(namespace), config))


def admit_review(review: dict[str, Any], view: ClusterView, config: Config,
                 quotas: quota.QuotaIndex | None = None) -> tuple[dict[str, Any], Decision]:
    """The API server's answer to an AdmissionReview: for a pod both pod webhooks, chained (the mutating
    answer, or the validating denial of its result); for a workload, validate-workloads."""
    request, uid = request_of(review)
    if workload_kind(request) is not None:
        decision = decide_workload(request, view, config)
    else:
        decision = admit(request, view, config)
        quota_warnings(request, decision, quotas, config)
    return respond(uid, decision, review.get("apiVersion")), decision
