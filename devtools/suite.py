"""`make test`: every tier and every build they need, placed on the machine's two cores, and a timeline of where
the minutes went.

Each step is a command; a step starts once the steps it needs have passed, and steps of one lane run one after
another. In order:

    first     lint, the newest control plane, the Debian packages, the image and kube-network-policies
    newest    the unit tier, then the fault tier with nothing else at full weight beside it (its verdicts are
              timed to the second), then the e2e tier on the newest Kubernetes, then its node tier
    floor     once the fault tier is done, the floor's e2e tier beside the newest's; its node tier after the
              newest's (the node tiers with no other tier beside them), then the cert-manager tier
    release   the release tier at the lowest weight, from the unit tier's end (beside the fault tier)
    builds    from the start, at the lowest weight: the floor's control plane, cert-manager, the release's tools

A step marked low (the builds lane, and the release tier, which mostly builds) runs in a session of its own at
nice 19, its autogroup at nice 19 too. Linux groups the processes of a session for the scheduler (autogroup), and
`nice` ranks a process only inside its group; every service a tier starts runs in a session of its own, so a
build niced only in make's session still took half the cores from the tiers' API servers. With its group's
weight lowered it takes what they leave idle.

A step that fails fails the run; the steps that need it are skipped, the others go on. At the end the timeline,
minutes from the start, says each step's start, end and result.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devtools import paths

MAKE = ("make", "--no-print-directory")
PYTEST = (sys.executable, "-m", "pytest", "-q", "--durations=10")
FLOOR = {"HAMI_MT_KUBE_VERSION": "floor"}


@dataclass(frozen=True)
class Step:
    """One command of the run: `needs` the names of the steps that must pass first, `env` what it adds, `low`
    at the lowest weight (module docstring)."""

    name: str
    lane: str
    command: tuple[str, ...]
    needs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    low: bool = False

#: What `make test` runs, in the order of the module docstring: nothing but low-weight steps shares the cores
#: with the fault tier; after it, the newest and the floor's e2e tiers side by side, then each node tier alone.
PLAN = (
    Step("lint", "first", (*MAKE, "lint")),
    Step("controlplane", "build", (*MAKE, "controlplane")),
    # every Debian package at once, before anything else asks apt for one (two installs at once fail on its lock)
    Step("packages", "image", (*MAKE, "prometheus", "image-tools", "node-tools", "netpol-tools",
                               "release-test-tools")),
    Step("image", "image", (*MAKE, "image", "previous", "IMAGE_BASES=standin"), needs=("packages",)),
    Step("kube-network-policies", "image", (*MAKE, "kube-network-policies")),
    Step("controlplane-floor", "builds", (*MAKE, "controlplane-floor"), low=True),
    Step("release and cert-manager tools", "builds", (*MAKE, "release-tools", "cert-manager"), low=True),
    # The unit tier times a few things too (a write deadline, a heap given back): beside builds at full weight
    # (load 24 on 2 cores) three of them failed, so it waits for them, as every tier does.
    Step("unit tier", "newest", (*PYTEST, "-m", "not e2e"),
         needs=("lint", "packages", "controlplane", "image", "kube-network-policies")),
    # The fault tier uses about one core: the low-weight builds and the release tier take the other.
    Step("fault tier", "newest", (*PYTEST, "-m", "faults"), needs=("unit tier",)),
    # at the lowest weight, beside the fault tier: it mostly builds (the arm64 image under qemu)
    Step("release tier", "release", (*PYTEST, "-m", "release"),
         needs=("unit tier", "release and cert-manager tools"), low=True),
    Step("e2e tier", "newest", (*PYTEST, "-m", "e2e"), needs=("fault tier",)),
    Step("e2e tier, floor", "floor", (*PYTEST, "-m", "e2e"), needs=("fault tier", "controlplane-floor"), env=FLOOR),
    # The node tiers one at a time with no other tier beside them: beside the floor's node and cert-manager
    # tiers, two of the newest's uptime tests each lost a pod (EOF on a kept-alive connection) in a rollout.
    Step("node tier", "newest", (*PYTEST, "-m", "node"), needs=("e2e tier", "e2e tier, floor")),
    Step("node tier, floor", "floor", (*PYTEST, "-m", "node"), needs=("node tier",), env=FLOOR),
    Step("cert-manager tier", "floor", (*PYTEST, "-m", "certmanager"),
         needs=("node tier, floor", "release and cert-manager tools")),
)


def _lowest_weight() -> None:
    """In the child, after its new session: nice 19 for it and for its autogroup (module docstring)."""
    os.nice(19)
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:  # a kernel without autogroup scheduling ranks by nice alone
        pass


@dataclass
class Ran:
    """What became of a step: minutes from the start, and its result (`passed`, `FAILED`, `skipped`)."""

    step: Step
    start: float = 0.0
    end: float = 0.0
    result: str = ""


class Suite:
    """Runs `plan`: one thread per lane, each step's output in a file of its own, printed whole when it ends."""

    def __init__(self, plan: Sequence[Step], logs: Path) -> None:
        names = [s.name for s in plan]
        unknown = {n for s in plan for n in s.needs} - set(names)
        if unknown or len(set(names)) != len(names):
            raise ValueError(f"the plan names steps it does not have, or one twice: {sorted(unknown)}")
        self.plan, self.logs = list(plan), logs
        self.ran = {s.name: Ran(s) for s in plan}
        self._done = threading.Condition()
        self._print = threading.Lock()
        self._t0 = time.monotonic()

    def minutes(self) -> float:
        return (time.monotonic() - self._t0) / 60

    def run(self) -> bool:
        lanes: dict[str, list[Step]] = {}
        for step in self.plan:
            lanes.setdefault(step.lane, []).append(step)
        threads = [threading.Thread(target=self._lane, args=(steps,), name=lane) for lane, steps in lanes.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._timeline()
        return all(r.result == "passed" for r in self.ran.values())

    def _lane(self, steps: list[Step]) -> None:
        for step in steps:
            with self._done:
                self._done.wait_for(lambda s=step: all(self.ran[n].result for n in s.needs))  # type: ignore[misc]
                blocked = [n for n in step.needs if self.ran[n].result != "passed"]
            ran = self.ran[step.name]
            ran.start = self.minutes()
            if blocked:
                ran.result = "skipped"
                self._say(f"== {step.name}: skipped, since {', '.join(blocked)} did not pass")
            else:
                ran.result = self._one(step)
            ran.end = self.minutes()
            with self._done:
                self._done.notify_all()

    def _one(self, step: Step) -> str:
        log = self.logs / (step.name.replace(" ", "-").replace(",", "") + ".log")
        low = step.low
        self._say(f"== {step.name} ({step.lane}{', lowest weight' if low else ''}) at {self.minutes():.1f} min: "
                  f"{' '.join(step.command)}")
        with open(log, "wb") as out:
            code = subprocess.call(step.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=paths.REPO_ROOT, env={**os.environ, **step.env},
                                   start_new_session=low, preexec_fn=_lowest_weight if low else None)
        result = "passed" if code == 0 else "FAILED"
        took = self.minutes() - self.ran[step.name].start
        self._say(f"== {step.name}: {result} in {took:.1f} min{f' (exit {code})' if code else ''}\n"
                  + log.read_text(errors="replace"))
        return result

    def _say(self, text: str) -> None:
        with self._print:
            print(text, flush=True)

    def _timeline(self) -> None:
        rows = sorted(self.ran.values(), key=lambda r: (r.start, r.end))
        lines = [f"make test: {self.minutes():.1f} minutes; each step's start and end, minutes from the start",
                 f"{'step':34} {'lane':8} {'start':>6} {'end':>6} {'took':>6}  result"]
        lines += [f"{r.step.name:34} {r.step.lane:8} {r.start:6.1f} {r.end:6.1f} {r.end - r.start:6.1f}  {r.result}"
                  for r in rows]
        self._say("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="STEP",
                        help="run only this step (again for more); the steps it needs are taken as passed")
    args = parser.parse_args(argv)
    plan: Sequence[Step] = PLAN
    if args.only:
        missing = set(args.only) - {s.name for s in PLAN}
        if missing:
            parser.error(f"--only {sorted(missing)}: no such step (steps: {', '.join(s.name for s in PLAN)})")
        plan = [Step(s.name, s.lane, s.command, (), s.env, s.low) for s in PLAN if s.name in args.only]
    with tempfile.TemporaryDirectory(prefix="hami-mt-suite-") as logs:
        return 0 if Suite(plan, Path(logs)).run() else 1


if __name__ == "__main__":
    sys.exit(main())
