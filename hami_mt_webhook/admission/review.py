"""AdmissionReview in, AdmissionReview out: the one seam the server, the CLI and the tests share."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from ..rules import pods as rules
from ..rules import workloads
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision
from ..rules.text import quote
from . import enforcement

#: A pod rule: the pod being created in, the decision out.
Rule = Callable[[Any, ClusterView, Config], Decision]
#: What a webhook does with one admission request (operation, kind, object, oldObject).
Handler = Callable[[dict[str, Any], ClusterView, Config], Decision]

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
REASONS = {400: "BadRequest", 403: "Forbidden", 503: "ServiceUnavailable"}
#: The pod subresource `kubectl debug` writes to; reviewed on UPDATE by validate-pods.
EPHEMERAL = "ephemeralcontainers"


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


def answer(review: dict[str, Any], handler: Handler, view: ClusterView,
           config: Config) -> tuple[dict[str, Any], Decision]:
    """Apply a webhook's `handler` to the review's request."""
    request, uid = request_of(review)
    decision = handler(request, view, config)
    return respond(uid, decision, review.get("apiVersion")), decision


def decide(request: dict[str, Any], rule: Rule, view: ClusterView, config: Config) -> Decision:
    """A pod rule on a request; CREATE of a Pod is all the pod rules look at."""
    if request.get("operation") != "CREATE":
        return Decision()
    kind = request.get("kind")
    if isinstance(kind, dict) and kind.get("kind") not in (None, "Pod"):
        return Decision()
    if request.get("subResource"):
        return Decision()
    obj = request.get("object")
    if obj is None:
        return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
    return rule(obj, view, config)


def decide_workload(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """validate-workloads: the pod rules on a workload's pod template, on CREATE and UPDATE; never a patch."""
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE") or request.get("subResource"):
        return Decision()
    obj = request.get("object")
    if obj is None:
        return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
    kind = _workload_kind(request)
    if kind is None:
        return Decision()
    old = request.get("oldObject") if operation == "UPDATE" else None
    return enforcement.soften(workloads.check(obj, kind, view, config, old=old), config)


def decide_validate(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
    """validate-pods: the final pod on CREATE, and new ephemeral containers on UPDATE of
    pods/ephemeralcontainers (`kubectl debug`), which only the privilege rule judges (SPEC.md §4.3)."""
    if request.get("operation") == "UPDATE" and request.get("subResource") == EPHEMERAL:
        obj = request.get("object")
        if obj is None:
            return Decision.deny("the AdmissionReview request has no object", "malformed", 400)
        return enforcement.soften(rules.ephemeral(obj, request.get("oldObject"), config), config)
    return decide(request, enforcement.validate, view, config)


def _kind(request: dict[str, Any]) -> Any:
    """The request's kind, else its object's (hand-written reviews often leave `request.kind` out)."""
    kind = request.get("kind")
    name = kind.get("kind") if isinstance(kind, dict) else None
    obj = request.get("object")
    return obj.get("kind") if name is None and isinstance(obj, dict) else name


def _workload_kind(request: dict[str, Any]) -> workloads.Kind | None:
    """The workload table's entry for the request: by `request.kind`'s group and kind, else by the object's."""
    kind = request.get("kind")
    if isinstance(kind, dict) and isinstance(kind.get("kind"), str):
        group = kind.get("group")
        return workloads.find(kind["kind"], group if isinstance(group, str) else "")
    return workloads.of(request.get("object"))


def _pods(rule: Rule) -> Handler:
    def handler(request: dict[str, Any], view: ClusterView, config: Config) -> Decision:
        return decide(request, rule, view, config)
    return handler


#: Handler ids; the webhook configurations call https://<service>/<id>.
WEBHOOKS: dict[str, Handler] = {
    "mutate-pods": _pods(enforcement.mutate),
    "validate-pods": decide_validate,
    "validate-workloads": decide_workload,
}


#: Paths under this prefix (`/warn/mutate-pods`, ...) answer under `warn` whatever the server's enforcement: the
#: webhook configurations send them the requests of namespaces labelled `hami.io/enforcement: warn` (§4.10).
WARN_PREFIX = "warn/"


def route(webhook: str, config: Config) -> tuple[str, Config]:
    """The handler id a path names, and the settings to answer it with."""
    if webhook.startswith(WARN_PREFIX):
        return webhook[len(WARN_PREFIX):], warned(config)
    return webhook, config


@lru_cache(maxsize=8)
def warned(config: Config) -> Config:
    """`config` under `warn`; cached, as it is asked for on every review of a namespace in warn."""
    return config if config.enforcement == enforcement.WARN else dataclasses.replace(config, enforcement="warn")


def respond(uid: str, decision: Decision, api_version: Any = None) -> dict[str, Any]:
    """The AdmissionReview a webhook returns for `decision`."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code, "message": decision.message,
                              "reason": REASONS.get(decision.code, "Forbidden")}
    if decision.warnings:
        response["warnings"] = decision.warnings
    if decision.patch:
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


def handle(body: bytes, webhook: str, view: ClusterView, config: Config) -> Reply:
    """The HTTP seam: status code and body for a POST to /<webhook>."""
    try:
        review = parse(body) if route(webhook, config)[0] in WEBHOOKS else {}
    except BadReview as err:
        return Reply(400, orjson.dumps({"error": str(err)}))
    return handle_parsed(review, webhook, view, config)


def handle_parsed(review: dict[str, Any], webhook: str, view: ClusterView, config: Config) -> Reply:
    """`handle` for a body already decoded with `parse` (the server decodes large bodies in a thread)."""
    webhook, config = route(webhook, config)
    handler = WEBHOOKS.get(webhook)
    if handler is None:
        return Reply(404, orjson.dumps({"error": f"no webhook {quote(webhook)}; known: {', '.join(WEBHOOKS)}"}))
    try:
        request, _ = request_of(review)
        out, decision = answer(review, handler, view, config)
    except BadReview as err:
        return Reply(400, orjson.dumps({"error": str(err)}))
    return Reply(200, orjson.dumps(out), decision, request)


#: What the API server does with both pod webhooks: mutate, then validate the patched pod.
admit = enforcement.admit


def admit_review(review: dict[str, Any], view: ClusterView, config: Config) -> tuple[dict[str, Any], Decision]:
    """The server's answer to an AdmissionReview: for a pod both webhooks (the mutating answer, or the
    validating denial of its result); for a workload, validate-workloads."""
    request, uid = request_of(review)
    if _workload_kind(request) is not None:
        decision = decide_workload(request, view, config)
        return respond(uid, decision, review.get("apiVersion")), decision
    if request.get("subResource") == EPHEMERAL:
        decision = decide_validate(request, view, config)
        return respond(uid, decision, review.get("apiVersion")), decision
    mutated = decide(request, enforcement.mutate, view, config)
    final = mutated
    if mutated.allowed and mutated.object is not None:
        final = enforcement.merge(mutated, decide({**request, "object": mutated.object}, enforcement.validate,
                                                  view, config))
    return respond(uid, final, review.get("apiVersion")), final
