"""Tiers that run only when asked: their marker named in `-m` (the node tier, the fault tier, the hami tier)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def only_when_selected(config: pytest.Config, items: list[pytest.Item], marker: str, directory: Path) -> None:
    """Mark every test below `directory` with `marker`; leave them out unless the marker expression names it
    (a tier that needs root, or a tree fetched apart, must not run in a plain `pytest`)."""
    ours = [item for item in items if item.path.is_relative_to(directory)]
    for item in ours:
        item.add_marker(getattr(pytest.mark, marker))
    if marker not in (config.option.markexpr or ""):
        config.hook.pytest_deselected(items=ours)
        items[:] = [item for item in items if not item.path.is_relative_to(directory)]


def report_measured(terminalreporter: pytest.TerminalReporter, tier: str, lines: list[str]) -> None:
    """What a tier measured, as a section at the end of the run (nothing when it measured nothing)."""
    if lines:
        terminalreporter.section(f"{tier}: measured")
        for line in lines:
            terminalreporter.write_line(line)


class Tier:
    """A measuring tier's two hooks, written once for every tier: its conftest binds them to the hooks' names,
    by which pytest finds them (`pytest_collection_modifyitems, pytest_terminal_summary = TIER.hooks()`)."""

    def __init__(self, marker: str, conftest: str, title: str) -> None:
        self.marker, self.directory, self.title = marker, Path(conftest).resolve().parent, title
        #: Lines for the summary at the end of the run: what the tier measured.
        self.measured: list[str] = []

    def hooks(self) -> tuple[Callable[[pytest.Config, list[pytest.Item]], None],
                             Callable[[pytest.TerminalReporter], None]]:
        """pytest_collection_modifyitems (the tier left out unless `-m` names it) and pytest_terminal_summary."""
        return self.select, self.report

    def select(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        only_when_selected(config, items, self.marker, self.directory)

    def report(self, terminalreporter: pytest.TerminalReporter) -> None:
        report_measured(terminalreporter, self.title, self.measured)
