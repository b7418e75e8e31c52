"""The benchmark's own plumbing: its workload still means what it says, and its parsers read their tools.

No timing is asserted here; `make bench` prints figures, it does not pass or fail on them.
"""

from __future__ import annotations

import importlib
import math

import orjson
import pytest

from devtools.bench import cli, http, report, workload
from devtools.cluster import CONFIG, pod
from hami_mt_webhook.admission import review
from hami_mt_webhook.rules.capacity import ClusterView

WRK_OUTPUT = """Running 2s test @ https://127.0.0.1:40001/mutate-pods
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.30ms  850.12us  12.73ms   88.00%
    Req/Sec     3.54k   210.00     3.80k    75.00%
  Latency Distribution
     50%    4.22ms
     75%    4.60ms
     90%    5.10ms
     99%    8.63ms
  7082 requests in 2.01s, 9.93MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   3521.40
Transfer/sec:      4.94MB
BENCH p50=4220.0 p99=8630.0 p999=10300.0 max=12730.0 requests=7082 duration=2010000.0 errors=3
"""


def test_the_mix_gives_the_outcomes_it_is_named_for() -> None:
    view = ClusterView.from_nodes(workload.cluster(4, 2), CONFIG)
    for kind, body in zip(workload.KINDS, workload.bodies(), strict=True):
        reply = review.handle(body, "mutate-pods", view, CONFIG)
        assert reply.status == 200
        assert workload.outcome(reply.decision) == workload.EXPECT[kind], kind


def test_the_node_index_sees_every_synthetic_node() -> None:
    view = ClusterView.from_nodes(workload.cluster(20, 10), CONFIG)
    assert len(view) == 30
    assert view.candidates({}, CONFIG).capacities == frozenset({96, 160})
    pinned = view.candidates(pod("exclusive")["spec"], CONFIG)
    assert pinned.capacities == frozenset({160}) and pinned.max_cards == 8


def test_parse_wrk() -> None:
    load = http.parse_wrk(WRK_OUTPUT, "webhook", 16)
    assert load.rps == pytest.approx(3521.40)
    assert load.p50 == pytest.approx(4.22) and load.p99 == pytest.approx(8.63)
    assert load.p999 == pytest.approx(10.3) and load.max == pytest.approx(12.73)
    assert load.requests == 7082 and load.errors == 3 and load.seconds == pytest.approx(2.01)


def test_lua_strings_escape_quotes_backslashes_and_bytes() -> None:
    assert http.lua_string(b'{"a":"b\\\\c"}\n') == '"{\\"a\\":\\"b\\\\\\\\c\\"}\\010"'
    script = http.wrk_script(workload.bodies())
    assert script.count('wrk.format("POST", "/mutate-pods"') == 1 and "latency:percentile(99.9)" in script


M = "apiserver_admission_webhook_admission_duration_seconds"
OURS = 'name="mutate.hami-mt.mthreads.com",operation="CREATE",type="admit",rejected='


def _series(rejected: str, buckets: dict[str, int], total: float) -> list[str]:
    labels = OURS + f'"{rejected}"'
    lines = [f'{M}_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets.items()]
    return [*lines, f"{M}_sum{{{labels}}} {total}", f"{M}_count{{{labels}}} {buckets['+Inf']}"]


METRICS = "\n".join([
    f"# HELP {M} [STABLE] Admission webhook latency", f"# TYPE {M} histogram",
    *_series("false", {"0.005": 80, "0.025": 100, "+Inf": 100}, 0.3),
    *_series("true", {"0.005": 20, "0.025": 20, "+Inf": 20}, 0.02),
    f'{M}_count{{name="other",operation="UPDATE",rejected="false",type="admit"}} 7',
])


def test_histograms_merge_label_sets_and_interpolate_like_histogram_quantile() -> None:
    got = report.histograms(METRICS, M, ["name", "type"], {"operation": "CREATE"})
    assert list(got) == [("mutate.hami-mt.mthreads.com", "admit")]
    h = got[("mutate.hami-mt.mthreads.com", "admit")]
    assert h.count == 120 and h.buckets[0.005] == 100 and h.mean == pytest.approx(0.32 / 120)
    assert h.quantile(0.5) == pytest.approx(0.005 * 60 / 100)
    assert h.quantile(0.99) == pytest.approx(0.005 + 0.02 * (118.8 - 100) / 20)
    assert h.share_within(0.005) == pytest.approx(100 / 120)
    empty = h.minus(h)
    assert empty.count == 0 and math.isnan(empty.quantile(0.5)) and math.isnan(empty.mean)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert report.percentile(values, 50) == 500 and report.percentile(values, 99.9) == 999
    assert math.isnan(report.percentile([], 50))


def test_arguments() -> None:
    opts = cli.parse_args(["--quick", "--skip-apiserver", "--parts", "1,index,apiserver"])
    assert opts.parts == ["http", "index"] and opts.duration == 2.0 and opts.pods == 60
    assert cli.parse_args([]).duration == 10.0
    with pytest.raises(SystemExit):
        cli.parse_args(["--parts", "nope"])


def test_review_bodies_are_admission_reviews() -> None:
    for body in workload.bodies():
        doc = orjson.loads(body)
        assert doc["kind"] == "AdmissionReview" and doc["request"]["operation"] == "CREATE"


def test_every_part_is_a_module_with_a_run() -> None:
    for name, module in cli.PARTS.items():
        assert callable(importlib.import_module(module).run), name
