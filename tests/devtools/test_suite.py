"""`make test`'s plan (devtools.suite): what may share the cores with the fault tier, and how a step's failure and
weight reach the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devtools.procs import autogroup_nice
from devtools.suite import PLAN, Step, Suite


def _closure(name: str, plan: tuple[Step, ...], up: bool) -> set[str]:
    """The steps `name` needs, directly or not (`up`), or those that need it."""
    by = {s.name: s for s in plan}
    seen: set[str] = set()
    todo = [name]
    while todo:
        n = todo.pop()
        nxt = list(by[n].needs) if up else [s.name for s in plan if n in s.needs]
        todo += [m for m in nxt if m not in seen]
        seen |= set(nxt)
    return seen


def test_only_the_lowest_weight_steps_can_run_beside_the_fault_tier() -> None:
    before, after = _closure("fault tier", PLAN, True), _closure("fault tier", PLAN, False)
    beside = {s.name for s in PLAN} - before - after - {"fault tier"}
    assert beside and all(s.low for s in PLAN if s.name in beside), beside


def test_every_tier_runs_and_every_step_it_needs_is_in_the_plan() -> None:
    markers = {s.command[-1] + ("@floor" if s.env else "") for s in PLAN if s.command[-2] == "-m"}
    assert markers == {"not e2e", "e2e", "node", "faults", "release", "certmanager", "e2e@floor", "node@floor"}
    Suite(PLAN, Path("."))  # refuses a plan naming a step it does not have


def test_a_failed_step_fails_the_run_and_skips_what_needs_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    py = sys.executable
    plan = (Step("breaks", "a", (py, "-c", "raise SystemExit(3)")),
            Step("after it", "a", (py, "-c", "pass"), needs=("breaks",)),
            Step("beside", "b", (py, "-c", "print(open('/proc/self/autogroup').read().split()[-1])"), low=True))
    suite = Suite(plan, tmp_path)
    assert not suite.run()
    assert {n: r.result for n, r in suite.ran.items()} == {"breaks": "FAILED", "after it": "skipped",
                                                          "beside": "passed"}
    out = capsys.readouterr().out
    assert "== breaks: FAILED" in out and "(exit 3)" in out
    assert "== beside: passed" in out and "\n19\n" in out  # its autogroup at nice 19: the lowest weight
    assert "make test:" in out and "after it" in out.split("make test:")[1]  # the timeline names every step


def test_a_plan_that_names_a_missing_step_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nowhere"):
        Suite((Step("a", "x", ("true",), needs=("nowhere",)),), tmp_path)


def test_a_service_a_low_step_starts_in_a_session_of_its_own_keeps_the_lowest_weight(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """procs.spawn gives each service a session, hence an autogroup, of its own: at nice 0 it would take an
    equal share of the cores from the tiers beside the step."""
    child = "print(open('/proc/self/autogroup').read().split()[-1])"
    starts = ("import sys; from pathlib import Path; from devtools.procs import spawn; "
              f"log = Path(sys.argv[1]); spawn([sys.executable, '-c', {child!r}], log, mode='wb').wait(); "
              "print('service', log.read_text().strip())")
    plan = (Step("low", "a", (sys.executable, "-c", starts, str(tmp_path / "service.log")), low=True),
            Step("full", "b", (sys.executable, "-c", starts, str(tmp_path / "other.log"))))
    assert Suite(plan, tmp_path).run()
    out = capsys.readouterr().out
    low, full = out.split("== low: passed")[1], out.split("== full: passed")[1]
    assert "service 19" in low.split("==")[0]
    assert f"service {autogroup_nice()}" in full.split("==")[0]  # a step at full weight: its services as it is
