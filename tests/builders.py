"""Builders shared by the tests: pods as the API server presents them, AdmissionReviews, node views."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import uuid
from typing import Any

import jsonpatch

from devtools import gpus
from hami_mt_webhook.rules import templates
from hami_mt_webhook.rules.capacity import ClusterView

VGPU = "mthreads.com/vgpu"
MEMORY = "mthreads.com/sgpu-memory"
CORE = "mthreads.com/sgpu-core"
WHOLE = "mthreads.com/gpu"
SCHEDULER = "hami-scheduler"
PRODUCT = gpus.PRODUCT

#: The nodes of examples/nodes.yaml, as the rules read them.
S4000 = gpus.S4000.report("s4000-node")
S5000 = gpus.S5000.report("s5000-node")
ON_S4000 = gpus.S4000.selector
ON_S5000 = gpus.S5000.selector


def nodes_view() -> ClusterView:
    """A fresh, ready view of one S4000 node (1 card of 96) and one S5000 node (8 cards of 160)."""
    return ClusterView([S4000, S5000])


def container(name: str = "main", limits: dict[str, Any] | None = None,
              requests: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """One container; `limits`/`requests` are resource maps (None leaves the key out)."""
    out: dict[str, Any] = {"name": name, "image": "registry.example.com/mthreads/musa-runtime:latest"}
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        out["resources"] = resources
    out.update(fields)
    return out


def _quantity(value: Any) -> Any:
    # The API server serializes quantities as strings; ints are written in their canonical form.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _default_container(c: dict[str, Any]) -> dict[str, Any]:
    """What API defaulting does to a container's resources: a request defaults to its limit."""
    c = copy.deepcopy(c)
    resources = c.get("resources")
    if not isinstance(resources, dict):
        return c
    for part in ("limits", "requests"):
        if isinstance(resources.get(part), dict):
            resources[part] = {k: _quantity(v) for k, v in resources[part].items()}
    limits = resources.get("limits")
    if isinstance(limits, dict) and limits:
        requests = resources.setdefault("requests", {})
        if isinstance(requests, dict):
            for k, v in limits.items():
                requests.setdefault(k, v)
    return c


def make_pod(*containers: dict[str, Any], name: str = "pod", namespace: str = "default",
             annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             defaults: bool = True, **spec: Any) -> dict[str, Any]:
    """A Pod as the API server hands it to admission: defaulted schedulerName, requests copied from limits.

    `spec` keys go into `.spec` (nodeSelector=..., initContainers=[...], schedulerName=...).
    `defaults=False` keeps the containers exactly as given (no defaulting at all).
    """
    if not containers:
        containers = (container(limits={VGPU: 1}),)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if labels is not None:
        metadata["labels"] = dict(labels)
    body: dict[str, Any] = {"containers": [copy.deepcopy(c) for c in containers]}
    if defaults:
        body["containers"] = [_default_container(c) for c in containers]
        if "initContainers" in spec:
            spec["initContainers"] = [_default_container(c) for c in spec["initContainers"]]
        body.update({"restartPolicy": "Always", "schedulerName": "default-scheduler",
                     "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst"})
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


#: `kubectl debug`'s ephemeral container beside container "c", and the same run privileged.
DEBUGGER = {"name": "debugger", "image": "busybox", "targetContainerName": "c"}
ROOT_DEBUGGER = {**DEBUGGER, "name": "root", "securityContext": {"privileged": True}}


def bound_pod(*ephemeral_containers: dict[str, Any]) -> dict[str, Any]:
    """A bound slice pod, as the API server presents it on UPDATE of pods/ephemeralcontainers."""
    body = make_pod(container("c", {VGPU: "1", MEMORY: "32", CORE: "8"}), schedulerName=SCHEDULER,
                    nodeName="s5000-node", annotations={"mthreads.com/predicate-node": "s5000-node"})
    body["spec"]["ephemeralContainers"] = list(ephemeral_containers)
    return body


def review_body(pod: Any, operation: str = "CREATE", uid: str | None = None, dry_run: bool = False,
                old: Any = None, api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    """An AdmissionReview request for `pod`, shaped like kube-apiserver's."""
    meta: dict[str, Any] = pod["metadata"] if isinstance(pod, dict) and isinstance(pod.get("metadata"), dict) else {}
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(operation)
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": meta.get("name"),
        "namespace": meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": None if operation == "DELETE" else pod,
        "oldObject": old if old is not None else (pod if operation == "DELETE" else None),
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": options} if options else None,
    }
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def padded_request(line: int, head: int, body: bytes = b"{}") -> bytes:
    """A POST to /mutate-pods whose request line is `line` bytes and whose head is `head` bytes (padded in
    the query string, which the route ignores, and in one header), asking to close after its answer."""
    start = b"POST /mutate-pods?pad="
    request_line = start + b"x" * (line - len(start) - len(b" HTTP/1.1")) + b" HTTP/1.1"
    fixed = request_line + f"\r\nConnection: close\r\nContent-Length: {len(body)}\r\nX-Pad: ".encode()
    return fixed + b"y" * (head - len(fixed)) + b"\r\n\r\n" + body


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch of an AdmissionReview response (empty when there is none)."""
    if "patch" not in response:
        return []
    assert response.get("patchType") == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"], validate=True))


def patched(pod: Any, response: dict[str, Any]) -> Any:
    """The pod after the response's patch, as the API server would apply it."""
    return jsonpatch.apply_patch(pod, decode_patch(response))


#: Hypothesis examples run per property test, printed in the terminal summary (see conftest.py).
CASES: dict[str, int] = {}


def count_case(test: str) -> None:
    CASES[test] = CASES.get(test, 0) + 1


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON document, the root included: where the fuzzers break things."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


def edited(doc: Any, path: tuple, value: Any = None, delete: bool = False) -> Any:
    """A copy of `doc` with the value at `path` replaced by `value`, or removed."""
    if not path:
        return {} if delete else value
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def known(kind: str, group: str | None = None) -> templates.Kind:
    """`templates.find`, for a kind the table has: a test of a known kind fails here if it is not."""
    found = templates.find(kind, group)
    assert found is not None, f"{kind} ({group or 'any group'}) is not in the kind table"
    return found


def kind_of(obj: Any) -> templates.Kind:
    """`templates.of`, for an object of a kind the table has."""
    found = templates.of(obj)
    assert found is not None, f"{obj.get('apiVersion')} {obj.get('kind')} is not in the kind table"
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name: argparse keeps them in its `_SubParsersAction`, and nowhere public."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)
