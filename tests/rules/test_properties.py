"""Property tests: generated pods through the rules, generated bodies through the HTTP seam."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_mt_webhook.admission import review
from hami_mt_webhook.rules import pods as rules
from hami_mt_webhook.rules.capacity import ClusterView, NodeReport
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.quantities import QuantityError, whole
from tests.builders import (
    CORE,
    MEMORY,
    ON_S4000,
    ON_S5000,
    PRODUCT,
    SCHEDULER,
    VGPU,
    WHOLE,
    count_case,
    edited,
    nodes_view,
    paths,
    review_body,
)

CONFIG = Config()
VIEWS = {"s4000+s5000": nodes_view(), "fallback": ClusterView()}
SLICES = (VGPU, MEMORY, CORE)
ABSENT = object()


def fast(n: int) -> settings:
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- pods ----------------------------------------------------------------------------------------------------------

good_quantity = st.one_of(
    st.integers(1, 20),
    st.sampled_from(["1", "2", "4", "8", "16", "32", "32.0", "64", "96", "128", "160", "20", "2k", "1e1", "3", "12"]),
    st.integers(1, 400).map(str),
)
bad_quantity = st.one_of(
    st.sampled_from(["1.5", "-1", "0", "abc", "500m", "1Gi", "16Mi", "", "1e999", "9" * 40, " 3", "NaN", "+Inf",
                     "0.5Ki", "1E18", "1Ei", "0x10"]),
    st.none(), st.booleans(), st.floats(), st.integers(-(10**30), 10**30),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.lists(st.integers(), max_size=2), st.text(max_size=8),
)
quantity = st.one_of(good_quantity, good_quantity, good_quantity, bad_quantity)
resource_map = st.dictionaries(st.sampled_from([VGPU, VGPU, MEMORY, MEMORY, CORE, WHOLE, "cpu"]), quantity, max_size=4)
names = st.one_of(st.sampled_from(["main", "worker", "sidecar", "setup", "main"]), st.text(max_size=8), st.none(),
                  st.integers())


@st.composite
def resources(draw) -> Any:
    shape = draw(st.sampled_from(["defaulted", "defaulted", "limits only", "requests only", "own", "none", "odd"]))
    if shape == "none":
        return ABSENT
    if shape == "odd":
        return draw(st.sampled_from([None, {}, {"limits": None}, {"limits": {}, "requests": None}, [], "x",
                                     {"limits": [VGPU]}]))
    limits = draw(resource_map)
    if shape == "limits only":
        return {"limits": limits}
    if shape == "requests only":
        return {"requests": limits}
    if shape == "own":
        return {"limits": limits, "requests": draw(resource_map)}
    requests = dict(draw(st.dictionaries(st.sampled_from(list(SLICES)), quantity, max_size=1)))
    for key, value in limits.items():  # API defaulting: a missing request takes the limit
        requests.setdefault(key, value)
    return {"limits": limits, "requests": requests}


@st.composite
def containers(draw, init: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"image": "busybox"}
    name = draw(names)
    if name is not None:
        c["name"] = name
    res = draw(resources())
    if res is not ABSENT:
        c["resources"] = res
    if init and draw(st.booleans()):
        c["restartPolicy"] = "Always"  # a sidecar
    if draw(st.integers(0, 40)) == 0:
        c["securityContext"] = {"privileged": True}
    return c


def _affinity(expressions: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}


affinities = st.sampled_from([
    _affinity([{"key": PRODUCT, "operator": "In", "values": ["MTT-S4000"]}]),
    _affinity([{"key": PRODUCT, "operator": "NotIn", "values": ["MTT-S4000"]}]),
    _affinity([{"key": PRODUCT, "operator": "Exists"}]),
    _affinity([{"key": "nothing", "operator": "Exists"}]),
    _affinity([{"key": "mthreads.com/gpu.count", "operator": "Gt", "values": ["4"]}]),
    _affinity(5), _affinity([{"key": [1], "operator": "In", "values": ["a"]}]), _affinity("In"),
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["s4000-node"]}]}]}}},
    {"nodeAffinity": []}, "affinity",
])


@st.composite
def pods(draw) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(st.lists(containers(), min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(init=True), max_size=2))
    scheduler = draw(st.sampled_from([ABSENT, "", "default-scheduler", "default-scheduler", SCHEDULER, "other"]))
    if scheduler is not ABSENT:
        spec["schedulerName"] = scheduler
    selector = draw(st.sampled_from([ABSENT, ON_S4000, ON_S5000, {"kubernetes.io/hostname": "s5000-node"},
                                     {"nothing": "x"}, {}, ["x"]]))
    if selector is not ABSENT:
        spec["nodeSelector"] = dict(selector) if isinstance(selector, dict) else selector
    if draw(st.integers(0, 5)) == 0:
        spec["affinity"] = draw(affinities)
    if draw(st.integers(0, 40)) == 0:
        spec["nodeName"] = "s5000-node"
    metadata: dict[str, Any] = {"name": "p", "namespace": "default"}
    if draw(st.integers(0, 40)) == 0:
        metadata["annotations"] = {"mthreads.com/gpu-index": "0"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _labels(pod: dict[str, Any]) -> list[str]:
    """How a denial may name each container: its name in quotes, or #index when it has none."""
    out = []
    for group in ("initContainers", "containers"):
        for index, c in enumerate(pod["spec"].get(group) or []):
            name = c.get("name") if isinstance(c, dict) else None
            out.append(f'"{name}"' if isinstance(name, str) and name else f"#{index}")
    return out


def _container_dicts(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for g in ("initContainers", "containers") for c in (pod["spec"].get(g) or [])]


POD_LEVEL = {"node-name", "bind-annotation", "not-ready", "malformed"}


@pytest.mark.parametrize("view_name", list(VIEWS))
@fast(700)
@given(pod=pods())
def test_mutate_properties(view_name, pod):
    count_case(f"test_mutate_properties[{view_name}]")
    view = VIEWS[view_name]
    before = copy.deepcopy(pod)

    decision = rules.mutate(pod, view, CONFIG)                                       # (a) never raises
    assert pod == before, "mutate must not change its input"
    json.dumps(decision.patch)

    if decision.allowed:                                                              # (b) the patch is the object
        assert jsonpatch.apply_patch(pod, decision.patch) == decision.object
        assert all("mthreads.com/" not in op["path"] for op in decision.patch)
    else:                                                                             # (f) denials are clear
        assert decision.patch == []
        assert decision.code in (400, 403, 503)
        assert decision.message
        if decision.reason not in POD_LEVEL:
            assert any(label in decision.message for label in _labels(pod)), decision.message
        else:
            assert decision.code == {"malformed": 400, "not-ready": 503}.get(decision.reason, 403)

    again = rules.mutate(decision.object, view, CONFIG)                              # (c) idempotent
    assert again.patch == []
    assert again.allowed == decision.allowed

    out = decision.object
    if decision.allowed and out["spec"].get("schedulerName") == SCHEDULER:           # (d) requests == limits
        for c in _container_dicts(out):
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            for r in SLICES:
                if r in limits or r in requests:
                    assert r in limits and r in requests, (r, c)
                    assert whole(limits[r]) == whole(requests[r]), (r, c)
    if any(op["path"] == "/spec/schedulerName" for op in decision.patch):
        assert out["spec"]["schedulerName"] == SCHEDULER  # only pods that ask for slices are sent there
        assert any(r in ((c.get("resources") or {}).get("limits") or {}) for c in _container_dicts(out) for r in SLICES)

    checked = rules.validate(out, view, CONFIG)                                       # (e) validate agrees
    if decision.allowed:
        assert checked.allowed, checked.message
        assert checked.patch == []
    admitted = review.admit_pod(pod, view, CONFIG)
    assert admitted.allowed == decision.allowed


# --- every admitted pod fits a node, card by card, as HAMi's scheduler counts -------------------------------------

MODELS = {96: "MTT-S4000", 160: "MTT-S5000", 176: "MTT-S5000"}  # 176: an S5000 reported with overcommit_ratio 1.1


@st.composite
def clusters(draw) -> list[NodeReport]:
    """Sliced nodes of different card sizes that slice different numbers of cards (the vendor's gpu_ids)."""
    shapes = draw(st.lists(st.tuples(st.sampled_from(sorted(MODELS)), st.integers(1, 8)), min_size=1, max_size=4))
    return [NodeReport(f"n{i}", {PRODUCT: MODELS[c], "kubernetes.io/hostname": f"n{i}"}, cards, c)
            for i, (c, cards) in enumerate(shapes)]


@st.composite
def slice_pods(draw) -> dict[str, Any]:
    """Well-formed slice pods: the requests a user writes, multi-card and shared cards included."""
    def one(name: str) -> dict[str, Any]:
        limits: dict[str, Any] = {}
        kind = draw(st.sampled_from(["exclusive", "multi", "partial", "vendor", "multi-filled"]))
        if kind in ("exclusive", "multi", "multi-filled"):
            limits[VGPU] = str(1 if kind == "exclusive" else draw(st.integers(2, 9)))
        if kind == "multi-filled":
            per_card = draw(st.sampled_from([96, 160]))
            limits |= {MEMORY: str(per_card * int(limits[VGPU])), CORE: str(16 * int(limits[VGPU]))}
        if kind in ("partial", "vendor"):
            limits[MEMORY] = str(draw(st.sampled_from([2, 8, 20, 32, 64, 96, 100, 128, 160, 176])))
            if draw(st.booleans()):
                limits[CORE] = str(draw(st.integers(1, 16)))
            if kind == "partial":
                limits[VGPU] = "1"
        return {"name": name, "image": "busybox", "resources": {"limits": limits, "requests": dict(limits)}}

    spec: dict[str, Any] = {"containers": [one(f"c{i}") for i in range(draw(st.integers(1, 2)))]}
    init = draw(st.sampled_from(["none", "none", "init", "sidecar"]))
    if init != "none":
        spec["initContainers"] = [one("i0") | ({"restartPolicy": "Always"} if init == "sidecar" else {})]
    if draw(st.booleans()):
        spec["nodeSelector"] = {PRODUCT: draw(st.sampled_from(sorted(set(MODELS.values()))))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": spec}


def _fits(node: NodeReport, pod: dict[str, Any]) -> bool:
    """HAMi's scheduler (A.8), written apart from the rules: a container's N cards come from one node, each
    asked for memory/N and cores/N; the containers that run together share one card."""
    together_memory: float = 0
    together_cores: float = 0
    for group in ("initContainers", "containers"):
        for c in pod["spec"].get(group) or []:
            limits = c["resources"]["limits"]
            if not any(r in limits for r in SLICES):
                continue
            n, memory, cores = (whole(limits.get(r, 0)) for r in SLICES)
            if n > node.cards or memory > n * node.per_card or cores > 16 * n:
                return False
            if group == "containers" or c.get("restartPolicy") == "Always":
                together_memory, together_cores = together_memory + memory / n, together_cores + cores / n
    return together_memory <= node.per_card and together_cores <= 16


@fast(500)
@given(nodes=clusters(), pod=slice_pods())
def test_every_pod_admitted_fits_a_node_it_may_land_on(nodes, pod):
    count_case("test_every_pod_admitted_fits_a_node_it_may_land_on")
    decision = rules.mutate(pod, ClusterView(nodes), CONFIG)
    if not decision.allowed:
        return
    out = decision.object
    selector = out["spec"].get("nodeSelector") or {}
    reachable = [n for n in nodes if selector.items() <= n.labels.items()]
    if not reachable:
        return  # §2: a selector that matches no sliced node falls back to memoryPerCard (a cluster not yet labelled)
    assert any(_fits(n, out) for n in reachable), (decision.warnings, [(n.per_card, n.cards) for n in reachable])


def _numeric(value: Any) -> int | None:
    try:
        return whole(value)
    except QuantityError:
        return None


@fast(300)
@given(pod=pods())
def test_validate_never_allows_mixing_or_unequal_requests_on_hami_scheduler(pod):
    count_case("test_validate_never_allows_mixing_or_unequal_requests_on_hami_scheduler")
    decision = rules.validate(pod, VIEWS["s4000+s5000"], CONFIG)
    assert decision.patch == []
    if not decision.allowed:
        return
    for c in _container_dicts(pod):
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        asks = any(r in limits or r in requests for r in SLICES)
        assert not (asks and (WHOLE in limits or WHOLE in requests)), "mixing must never pass"
        if asks and pod["spec"].get("schedulerName") == SCHEDULER:
            for r in SLICES:
                if r in limits or r in requests:
                    assert _numeric(limits.get(r)) == _numeric(requests.get(r)) is not None


# --- raw AdmissionReview bodies through review.handle --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=8,
)


def _dumps(doc: Any) -> bytes:
    """Python's encoder, as a client might: big integers, NaN and all (orjson refuses to write them)."""
    return json.dumps(doc).encode()


@st.composite
def reviews(draw) -> dict[str, Any]:
    body = review_body(draw(pods()), uid=draw(st.text(min_size=1, max_size=12)),
                       operation=draw(st.sampled_from(["CREATE", "CREATE", "CREATE", "UPDATE", "DELETE"])),
                       dry_run=draw(st.booleans()))
    return body


@st.composite
def broken_reviews(draw) -> bytes:
    body = copy.deepcopy(draw(reviews()))  # sampled constants must stay as they are
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(body)))
        body = edited(body, path, draw(json_values), delete=bool(path) and draw(st.booleans()))
    return _dumps(body)


@st.composite
def truncated(draw) -> bytes:
    data = _dumps(draw(reviews()))
    return data[: draw(st.integers(0, len(data)))]


@st.composite
def deep(draw) -> bytes:
    depth = draw(st.integers(1, 3000))
    where = draw(st.sampled_from(["top", "request", "object", "annotation"]))
    nested = b"[" * depth + b"]" * depth if draw(st.booleans()) else b'{"a":' * depth + b"1" + b"}" * depth
    if where == "top":
        return nested
    if where == "request":
        return b'{"request":' + nested + b"}"
    inner = (b'{"uid":"deep","operation":"CREATE","object":{"spec":{"containers":[{"name":"c","resources":'
             b'{"limits":{"mthreads.com/vgpu":"1"}}}]},"metadata":{"annotations":')
    if where == "object":
        inner = b'{"uid":"deep","operation":"CREATE","object":'
        return b'{"request":' + inner + nested + b"}}"
    return b'{"request":' + inner + nested + b"}}}"


bodies = st.one_of(
    st.binary(max_size=300),
    truncated(),
    broken_reviews(), broken_reviews(), broken_reviews(),
    reviews().map(_dumps),
    deep(),
    st.text(max_size=50).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@fast(1200)
@given(body=bodies, webhook=st.sampled_from(["mutate-pods", "mutate-pods", "validate-pods", "nope", ""]),
       view_name=st.sampled_from(list(VIEWS)))
def test_handle_always_answers_well_formed(body, webhook, view_name):
    count_case("test_handle_always_answers_well_formed")
    reply = review.handle(body, webhook, VIEWS[view_name], CONFIG)
    assert reply.status in (200, 400, 404)
    answer = orjson.loads(reply.body)
    if reply.status != 200:
        assert isinstance(answer.get("error"), str) and answer["error"]
        assert reply.decision is None
        return
    request = orjson.loads(body)["request"]
    assert answer["kind"] == "AdmissionReview" and answer["apiVersion"] in review.API_VERSIONS
    response = answer["response"]
    assert response["uid"] == request["uid"]
    assert isinstance(response["allowed"], bool)
    assert set(response) <= {"uid", "allowed", "status", "warnings", "patch", "patchType"}
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403, 503)
        assert isinstance(response["status"]["message"], str) and response["status"]["message"]
        assert "patch" not in response
    if "patch" in response:
        assert response["patchType"] == "JSONPatch" and webhook == "mutate-pods"
        ops = json.loads(base64.b64decode(response["patch"], validate=True))
        assert ops and isinstance(ops, list)
        jsonpatch.apply_patch(request["object"], ops)
    for warning in response.get("warnings", []):
        assert isinstance(warning, str) and warning
