"""`make compat`: the end-to-end tier on every Kubernetes minor from the floor to the newest, one after
another, and a table of what each gave. Not part of CI (a cold machine builds a control plane per minor,
minutes each); `--write` puts the table into docs/compatibility.md between its markers.

    python -m devtools.scenarios.compat [--versions 1.33,1.35] [--write] [-- pytest arguments]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.builds.binaries import BIN_ENV, VERSION_ENV, ControlPlaneError, binaries, pinned_versions
from devtools.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "compatibility.md"
BEGIN, END = "<!-- compat table: begin -->", "<!-- compat table: end -->"
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<secs>[\d.]+)s")
OUTCOME = re.compile(r"^(FAILED|ERROR|SKIPPED) (.*)$")


@dataclass
class Outcome:
    """One minor's run: the server it built, pytest's counts, and the tests that did not pass (with why)."""

    minor: str
    server: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    minutes: float = 0.0
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def row(self) -> str:
        c = self.counts
        failed = sum(c.get(k, 0) for k in ("failed", "error", "errors"))
        notes = "; ".join(self.problems) or "all passed"
        return (f"| {self.server or self.minor} | {c.get('passed', 0)} | {failed} | {c.get('skipped', 0)} | "
                f"{self.minutes:.1f} | {notes} |")


def minors(wanted: str | None) -> list[str]:
    """"1.30" ... "1.37": the pinned ends and every minor between, or the comma-separated `wanted`."""
    if wanted:
        return [v.strip().removeprefix("v") for v in wanted.split(",") if v.strip()]
    pins = pinned_versions()
    first, last = (int(v.split(".")[1]) for v in (pins[0], pins[-1]))
    return [f"1.{m}" for m in range(first, last + 1)]


def run_one(minor: str, pytest_args: list[str]) -> Outcome:
    outcome = Outcome(minor)
    started = time.monotonic()
    try:
        outcome.server = binaries(minor).name.split("-etcd-")[0]
    except ControlPlaneError as e:
        outcome.problems.append(f"not built: {str(e).splitlines()[0]}")
        return outcome
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "e2e", "-rfEs", "-p",
                           "no:cacheprovider", *pytest_args],
                          cwd=REPO_ROOT, env={**_environ(), VERSION_ENV: minor, "COLUMNS": "400"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outcome.minutes = (time.monotonic() - started) / 60
    for line in proc.stdout.splitlines():
        if m := SUMMARY.match(line):
            outcome.counts = {k: int(n) for n, k in (part.split() for part in m["counts"].split(", "))}
        elif m := OUTCOME.match(line):
            text = m[2].removeprefix("[1] ")
            (outcome.skipped if m[1] == "SKIPPED" else outcome.problems).append(text[:200])
    if proc.returncode not in (0, 1):
        outcome.problems.append(f"pytest exited with status {proc.returncode}")
    return outcome


def _environ() -> dict[str, str]:
    """Ours, without binaries brought from elsewhere: each run takes the build of its own version."""
    return {k: v for k, v in os.environ.items() if k != BIN_ENV}


def table(outcomes: list[Outcome]) -> str:
    head = ["| Kubernetes | passed | failed | skipped | minutes | notes |", "|---|---|---|---|---|---|"]
    skipped = sorted({reason for o in outcomes for reason in o.skipped})
    tail = ["", "Skipped: " + "; ".join(skipped) + "."] if skipped else []
    return "\n".join(head + [o.row() for o in outcomes] + tail)


def write(doc: Path, text: str) -> None:
    body = doc.read_text()
    if BEGIN not in body or END not in body:
        raise SystemExit(f"{doc} lacks the markers {BEGIN} and {END}")
    before, rest = body.split(BEGIN, 1)
    doc.write_text(f"{before}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.scenarios.compat",
                                     description="The end-to-end tier on every Kubernetes minor, and a table.")
    parser.add_argument("--versions", help="comma-separated minors or versions (default: floor to newest)")
    parser.add_argument("--write", action="store_true",
                        help=f"put the table into {DOC.relative_to(REPO_ROOT)}")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -k one_hop)")
    args = parser.parse_args(argv)
    outcomes = []
    for minor in minors(args.versions):
        print(f"compat: Kubernetes {minor} ...", file=sys.stderr, flush=True)
        outcomes.append(run_one(minor, args.pytest_args))
        print(outcomes[-1].row(), file=sys.stderr, flush=True)
    text = table(outcomes)
    print(text)
    if args.write:
        write(DOC, text)
    return 0 if all(not o.problems and o.counts.get("passed") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
