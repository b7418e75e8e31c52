"""The benchmark's report: Markdown sections and tables, number formats, percentiles, Prometheus
histograms, cProfile tables, and the document with the machine and versions it ran on."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import importlib.metadata
import io
import math
import os
import platform
import pstats
import re
import shlex
import shutil
import ssl
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.paths import REPO_ROOT

#: Everything from this line on in the written report is kept when the benchmark writes it again.
NOTES_MARKER = "<!-- analysis: kept across reruns -->"


@dataclass
class Section:
    """One part's output: Markdown lines, and sentences for the summary at the top."""

    title: str
    lines: list[str] = field(default_factory=list)
    reading: list[str] = field(default_factory=list)
    part: str = ""  # the part that wrote it (cli sets it), by which a later write keeps or replaces it
    run: str = ""  # when its figures were taken, for a section kept from an earlier write
    skipped: bool = False  # no figures (what the part needs is missing): a write keeps the earlier ones

    def markdown(self) -> str:
        return "\n".join([f"## {self.title}", "", *self.lines, ""])


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values) / 100 - 1e-9))  # 99.9 * 1000 / 100 is 999.0000000000001
    return sorted_values[min(rank, len(sorted_values)) - 1]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


@dataclass
class Histogram:
    """One Prometheus histogram (cumulative buckets), summed over the label sets that were merged in."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, other: Histogram) -> Histogram:
        return Histogram({le: c - other.buckets.get(le, 0.0) for le, c in self.buckets.items()},
                         self.sum - other.sum, self.count - other.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """histogram_quantile(): linear interpolation inside the bucket that holds the rank."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            count = self.buckets[le]
            if count >= rank:
                if math.isinf(le):
                    return lower
                if count == below:
                    return le
                return lower + (le - lower) * (rank - below) / (count - below)
            lower, below = le, count
        return lower

    def share_within(self, bound: float) -> float:
        return self.buckets.get(bound, math.nan) / self.count if self.count else math.nan


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """The samples of Prometheus text: the name as written (with `_bucket`, `_sum`...), labels, value."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            yield m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))


def histograms(text: str, metric: str, key: Sequence[str], where: dict[str, str] | None = None
               ) -> dict[tuple[str, ...], Histogram]:
    """Histograms of `metric` from Prometheus text, grouped by the `key` labels, filtered by `where`."""
    out: dict[tuple[str, ...], Histogram] = {}
    for name, labels, value in samples(text):
        suffix = name[len(metric):]
        if not name.startswith(metric) or suffix not in ("_bucket", "_sum", "_count"):
            continue
        if where and any(labels.get(k) != v for k, v in where.items()):
            continue
        h = out.setdefault(tuple(labels.get(k, "") for k in key), Histogram())
        if suffix == "_bucket":
            le = float(labels["le"])
            h.buckets[le] = h.buckets.get(le, 0.0) + value
        elif suffix == "_sum":
            h.sum += value
        else:
            h.count += value
    return out


def stats_lines(source: cProfile.Profile | Path, sort: str, top: int) -> list[str]:
    """The pstats table (header and rows), printed as it is returned."""
    out = io.StringIO()
    stats = pstats.Stats(str(source) if isinstance(source, Path) else source, stream=out)
    stats.strip_dirs().sort_stats(sort).print_stats(top)
    text = out.getvalue().strip().splitlines()
    start = next((i for i, line in enumerate(text) if "ncalls" in line), 0)
    print("\n".join(text[start:]), flush=True)
    return text[start:]



def machine(load_start: str) -> list[str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, IndexError, ValueError):
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kib / 1024 / 1024:.1f} GiB memory"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"- CPU: {model}; nproc {usable} (of {os.cpu_count()} online){mem}",
            f"- Kernel: {platform.system()} {platform.release()}; load average (1, 5, 15 min) at the start: "
            f"{load_start}"]


def versions() -> list[str]:
    def v(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() or commit
    wrk = "not installed"
    if shutil.which("wrk"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=5)
            wrk = (out.stdout + out.stderr).splitlines()[0].split(" Copyright")[0]
    return [f"- hami-mt-webhook {v('hami-mt-webhook')} at {commit}; Python {platform.python_version()} "
            f"({platform.python_implementation()}), {ssl.OPENSSL_VERSION}",
            f"- aiohttp {v('aiohttp')}, kopf {v('kopf')}, orjson {v('orjson')}, "
            f"prometheus-client {v('prometheus-client')}; load generator: {wrk}"]


#: The Reading's closing line, the same in every report (not a part's).
CLOSING = ("Python serves one event loop per process: the webhook scales with replicas, not threads. The "
           "machine's other work shows in every figure; compare webhook and baseline from the same run only.")
#: Before each part's section and its group of Reading lines in the written report: which part, and for a
#: section when it ran, so that a later write of some parts keeps the others (`merge`).
_MARK = re.compile(r"^<!-- part: ([\w,-]*)(?:; run (.+?))? -->$")


def _mark(parts: Sequence[str], run: str = "") -> str:
    return f"<!-- part: {','.join(parts)}{f'; run {run}' if run else ''} -->"


#: Reading lines kept from an earlier write, with the parts they speak for.
Shared = Sequence[tuple[tuple[str, ...], list[str]]]


def earlier(text: str) -> tuple[list[Section], list[tuple[tuple[str, ...], list[str]]]]:
    """The sections of a written report, with the part each came from and when it ran, and the Reading
    lines that speak for several parts. A report written before the marks is read too: its sections get
    the parts of its command's `--parts` in order (they ran in that order), its Reading lines all of them."""
    generated = text.split(NOTES_MARKER, 1)[0]
    found = re.search(r"^Run (.+?)\.$", generated, re.M)
    run = found.group(1) if found else ""
    command = re.search(r"^python -m devtools\.bench .*--parts[ =](\S+)", generated, re.M)
    legacy = tuple(x for x in command.group(1).split(",") if x) if command else ()
    sections: list[Section] = []
    groups: list[tuple[tuple[str, ...], list[str]]] = []
    pending: tuple[str, str] | None = None  # a section's mark: its part, when it ran
    in_reading = False
    for line in generated.split("\n"):
        mark = _MARK.match(line)
        if mark and mark.group(2):
            pending = (mark.group(1), mark.group(2))
        elif mark:  # a group of Reading lines
            groups.append((tuple(x for x in mark.group(1).split(",") if x), []))
        elif line.startswith("## "):
            in_reading = line == "## Reading"
            if not in_reading:
                part, when = pending or ("", run)
                sections.append(Section(line[3:], part=part, run=when))
            pending = None
        elif in_reading and line.startswith("- ") and line[2:] != CLOSING:
            if not groups:
                groups.append((legacy, []))
            groups[-1][1].append(line[2:])
        elif sections and not in_reading:
            sections[-1].lines.append(line)
    unmarked = [sec for sec in sections if not sec.part]
    if unmarked and len(unmarked) == len(legacy) == len(sections):
        for sec, part in zip(unmarked, legacy, strict=True):
            sec.part = part
    for sec in sections:
        while sec.lines and not sec.lines[-1].strip():
            sec.lines.pop()
        while sec.lines and not sec.lines[0].strip():
            sec.lines.pop(0)
        sec.reading = [x for parts, lines in groups if parts == (sec.part,) and sec.part for x in lines]
    owned = {sec.part for sec in sections}
    return sections, [(parts, lines) for parts, lines in groups
                      if lines and not (len(parts) == 1 and parts[0] in owned)]


def merge(old: str, sections: Sequence[Section], order: Sequence[str]
          ) -> tuple[list[Section], list[tuple[tuple[str, ...], list[str]]]]:
    """This run's sections and those of the report `old` this run did not write again (another part and
    another title), in `order` (PARTS); old Reading lines are kept while none of the parts they speak
    for ran now. A skipped section (the part had nothing to measure with) never replaces earlier figures."""
    sections = [s for s in sections if not s.skipped]
    ran = {s.part for s in sections if s.part}
    titles = {s.title for s in sections}
    old_sections, shared = earlier(old)
    kept = [s for s in old_sections if s.part not in ran and s.title not in titles]
    rank = {p: i for i, p in enumerate(order)}
    merged = sorted([*kept, *sections], key=lambda s: rank.get(s.part, len(rank)))
    return merged, [(parts, lines) for parts, lines in shared if not ran & set(parts)]


def document(argv: Sequence[str], sections: list[Section], opts: argparse.Namespace, started: dt.datetime,
             load_start: str, load_end: str, shared: Shared = ()) -> str:
    """The report; `sections` may hold some kept from an earlier write (`merge`), which say when they ran."""
    command = shlex.join(["python", "-m", "devtools.bench", *argv])
    when = f"{started:%Y-%m-%d %H:%M} UTC"
    reading: list[str] = []
    left = list(shared)
    for s in sections:  # kept Reading lines where the first of their parts' sections stands
        for parts, lines in [g for g in left if s.part in g[0]]:
            left.remove((parts, lines))
            reading += [_mark(parts), *(f"- {line}" for line in lines)]
        if s.reading:
            reading += [_mark([s.part] if s.part else []), *(f"- {line}" for line in s.reading)]
    for parts, lines in left:
        reading += [_mark(parts), *(f"- {line}" for line in lines)]
    kept = [f"{s.title} ({s.run})" for s in sections if s.run and s.run != when]
    quick = ["", "**Quick run** (`--quick`, 2 s per point): a check that the harness works, not figures to "
             "quote."] if opts.quick else []
    earlier_runs = ["", "Kept from earlier runs, not run this time: " + "; ".join(kept)
                    + ". The machine and versions below are this run's."] if kept else []
    return "\n".join([
        "# Performance",
        "",
        "Written by `devtools/bench`; regenerate with `make bench BENCH_ARGS=\"--write "
        "docs/PERFORMANCE.md\"` on a quiet machine. The figures below come from one run of:",
        "",
        "```sh",
        command,
        "```",
        *quick,
        "",
        f"Run {when}.",
        *earlier_runs,
        "",
        *machine(load_start),
        f"- Load average at the end: {load_end}",
        *versions(),
        "",
        "## Reading",
        "",
        *(reading or ["- (no part ran)"]),
        f"- {CLOSING}",
        "",
        *[f"{_mark([s.part] if s.part else [], s.run or when)}\n{s.markdown()}" for s in sections],
    ])


def write(path: Path, text: str) -> None:
    """Write the report to `path`, keeping the hand-written analysis below NOTES_MARKER of the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = ""
    if path.exists():
        old = path.read_text()
        if NOTES_MARKER in old:
            kept = "\n" + old[old.index(NOTES_MARKER):]
    path.write_text(text + "\n" + kept)
