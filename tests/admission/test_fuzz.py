"""Seeded fuzzing of AdmissionReview bodies: every answer well formed, nothing raised, memory flat.

Bodies are built from a valid review by the usual ways input goes wrong: truncation, wrong types
anywhere, huge numbers, unicode, deep nesting, missing fields. The seed is fixed, so a failure
reproduces; the count is printed in the test summary.
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from typing import Any

import orjson

from hami_mt_webhook.admission import review
from hami_mt_webhook.rules.capacity import ClusterView, NodeReport
from hami_mt_webhook.rules.config import Config
from tests.builders import CASES, container, edited, make_pod, paths, review_body

CASES_PER_RUN = 6000
VIEW = ClusterView([NodeReport("s4", {"m": "4"}, 1, 96), NodeReport("s5", {"m": "5"}, 8, 160)])
CONFIG = Config()
ODD_VALUES: list[Any] = [None, True, 0, -1, 1.5, 10**40, -(10**40), "", "x" * 5000, "1e308", "😀", "\u0000",
                         [], {}, [1, [2, [3]]], {"a": {"b": {}}}, "NaN", "1Gi", "-0", "0.0000001"]
UNICODE = ["名前", "ключ/~0~1", "\ufffd", "🚀" * 50, "e\u0301", "\u202etxt"]


def seed_reviews() -> list[dict[str, Any]]:
    slices = {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 20, "mthreads.com/sgpu-core": 4}
    pods = [
        make_pod(container(limits=slices)),
        make_pod(container(limits={"mthreads.com/vgpu": 2}), nodeSelector={"m": "5"}),
        make_pod(container("a", limits={"mthreads.com/vgpu": 1}), container("b", limits={"mthreads.com/gpu": 1}),
                 initContainers=[container("init", limits={"mthreads.com/sgpu-memory": 4})]),
        make_pod(container(limits={"mthreads.com/gpu": 1, "mthreads.com/vgpu": 1})),
    ]
    return [review_body(p) for p in pods]


def mutant(rng: random.Random, seeds: list[dict[str, Any]]) -> bytes:
    doc = rng.choice(seeds)
    kind = rng.randrange(7)
    if kind == 0:  # truncated JSON
        raw = json.dumps(doc).encode()
        return raw[: rng.randrange(len(raw))]
    if kind == 1:  # random bytes
        return rng.randbytes(rng.randrange(1, 300))
    if kind == 2:  # deep nesting somewhere
        depth = rng.choice([10, 100, 5000])
        return json.dumps(doc).replace('"spec":', '"spec":' + "[" * depth + "1" + "]" * depth + ',"x":', 1).encode()
    target = rng.choice(paths(doc))
    if kind == 3:
        return json.dumps(edited(doc, target, delete=True)).encode()
    if kind == 4:  # unicode names and keys
        return json.dumps(edited(doc, target, rng.choice(UNICODE))).encode()
    return json.dumps(edited(doc, target, rng.choice(ODD_VALUES))).encode()


def check(body: bytes, webhook: str) -> None:
    reply = review.handle(body, webhook, VIEW, CONFIG)
    assert reply.status in (200, 400, 404)
    if reply.status == 200:
        out = orjson.loads(reply.body)
        response = out["response"]
        assert out["kind"] == "AdmissionReview"
        assert isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert response["status"]["code"] in (400, 403, 503)
            assert response["status"]["message"]
        request = orjson.loads(body)["request"]
        assert response["uid"] == request["uid"]


def test_fuzzed_reviews_get_well_formed_answers_and_memory_stays_flat():
    rng = random.Random(20261202)
    seeds = seed_reviews()
    bodies = [mutant(rng, seeds) for _ in range(CASES_PER_RUN)]
    webhooks = ["mutate-pods", "validate-pods"]
    half = CASES_PER_RUN // 2
    for body in bodies[:half]:  # warm up caches before measuring
        check(body, rng.choice(webhooks))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for body in bodies[half:]:
        check(body, rng.choice(webhooks))
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    name = "test_fuzzed_reviews (seeded, memory traced)"
    CASES[name] = CASES.get(name, 0) + CASES_PER_RUN
    assert grown < 256 * 1024, f"{grown} bytes retained over {CASES_PER_RUN - half} reviews"
