"""The benchmark's own plumbing: its workload still means what it says, and its parsers read their tools.

No timing is asserted here; `make bench` prints figures, it does not pass or fail on them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from devtools.bench import cli, http, report, workload
from devtools.bench.audit import slow_around_pass
from devtools.bench.scale_rig import Pods
from devtools.gpus import CONFIG, pod
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


# --- the harness the parts share --------------------------------------------------------------------------------------


def test_wrk_script_posts_to_the_path_it_is_given() -> None:
    script = http.wrk_script(workload.bodies(), "/webhook")
    assert script.count('wrk.format("POST", "/webhook"') == 1 and "/mutate-pods" not in script


@pytest.mark.parametrize(("status", "answer", "expected"), [
    (200, {"response": {"allowed": True, "patch": "W10="}}, ("patched", None)),
    (200, {"response": {"allowed": True}}, ("allowed", None)),
    (200, {"response": {"allowed": False, "status": {"code": 403, "message": "no"}}}, ("denied", 403)),
    (200, {"response": {"allowed": False, "status": {"code": 500, "message": "invalid"}}}, ("error", 500)),
    (500, {}, ("HTTP 500", None)),
])
def test_answers_tell_a_refusal_from_an_error(status: int, answer: dict[str, Any], expected: tuple) -> None:
    assert http.answered(status, answer) == expected


# --- --write keeps the parts not run ---------------------------------------------------------------------


LEGACY = f"""# Performance

```sh
python -m devtools.bench --parts http,apiserver --write docs/PERFORMANCE.md
```

Run 2026-12-04 04:54 UTC.

## Reading

- http says this.
- apiserver says that.
- {report.CLOSING}

## 1. Loopback HTTPS

http figures

## 4. Through a real kube-apiserver

apiserver figures

{report.NOTES_MARKER}
## Notes by hand
"""


def _write(path: Path, sections: list[report.Section], day: int) -> str:
    opts = argparse.Namespace(quick=False)
    old = path.read_text() if path.exists() else ""
    merged, shared = report.merge(old, sections, list(cli.PARTS))
    report.write(path, report.document(["--write", str(path)], merged, opts,
                                       dt.datetime(2027, 1, day, tzinfo=dt.UTC), "0", "0", shared))
    return path.read_text()


def test_write_keeps_the_sections_of_parts_not_run_and_replaces_those_run(tmp_path) -> None:
    path = tmp_path / "PERFORMANCE.md"
    path.write_text(LEGACY)
    text = _write(path, [report.Section("Peers", ["peers figures"], ["peers says so."], part="peers")], 1)
    assert "http figures" in text and "apiserver figures" in text and "peers figures" in text
    assert text.index("http figures") < text.index("apiserver figures") < text.index("peers figures")
    assert "- http says this." in text and "- peers says so." in text and text.count(report.CLOSING) == 1
    assert "Kept from earlier runs" in text and "(2026-12-04 04:54 UTC)" in text
    assert text.endswith("## Notes by hand\n")
    # Written again with the marks: running http replaces its section, and the Reading lines that spoke for
    # it; the others stay as they were.
    again = _write(path, [report.Section("1. Loopback HTTPS", ["new http figures"], ["http now."], part="http")],
                   2)
    assert "new http figures" in again and "\nhttp figures" not in again
    assert "apiserver figures" in again and "peers figures" in again and "- peers says so." in again
    assert "- http now." in again and "http says this" not in again
    assert again.count("## 1. Loopback HTTPS") == 1 and again.endswith("## Notes by hand\n")


def test_a_skipped_part_keeps_its_earlier_figures_in_the_written_report(tmp_path) -> None:
    path = tmp_path / "PERFORMANCE.md"
    path.write_text(LEGACY)
    _write(path, [report.Section("Peers", ["peers figures"], ["peers says so."], part="peers")], 1)
    skipped = report.Section("Peers", ["Skipped: no HAMi tree"], part="peers", skipped=True)
    text = _write(path, [skipped], 2)
    assert "peers figures" in text and "- peers says so." in text and "no HAMi tree" not in text
    assert "Peers (2027-01-01 00:00 UTC)" in text  # still said to come from the earlier run


def test_a_written_report_reads_back_as_its_sections(tmp_path) -> None:
    path = tmp_path / "PERFORMANCE.md"
    written = [report.Section("A", ["line", "", "| t |"], ["a says."], part="http"),
               report.Section("B", ["other"], [], part="peers")]
    _write(path, written, 3)
    sections, shared = report.earlier(path.read_text())
    assert [(s.title, s.part, s.lines, s.reading, s.run) for s in sections] == [
        ("A", "http", ["line", "", "| t |"], ["a says."], "2027-01-03 00:00 UTC"),
        ("B", "peers", ["other"], [], "2027-01-03 00:00 UTC")]
    assert shared == []


def test_slow_creations_are_placed_before_in_and_after_the_pass() -> None:
    pods = Pods(client_ms=[3.0, 40.0, 30.0, 2.0, 50.0], client_at=[95.0, 101.0, 103.0, 107.0, 121.0])
    last = {"last_success_timestamp_seconds": 120.0, "duration_seconds": 20.0}
    assert slow_around_pass(pods, last) == "before 0 of 1; 0-5 s 2 of 2; 5-10 s 0 of 1; after 1 of 1"
    assert slow_around_pass(pods, {}) == "no pass ended while measured"
