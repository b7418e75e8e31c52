"""Documentation that states what the code does is checked against the code, so the two cannot drift.

(The messages quoted in docs/ are checked in test_examples.py; the log fields in test_logs.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from hami_mt_webhook.admission import chart
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.cli import settings

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_configuration_table_lists_every_serve_setting_with_its_variable_and_default():
    table = [line for line in _section(README.read_text(), "Configuration").splitlines() if line.startswith("| `")]
    documented: dict[str, tuple[str, str]] = {}
    for row in table:
        flags, envs, defaults = (re.findall(r"`([^`]+)`", cell) for cell in row.split("|")[1:4])
        for i, flag in enumerate(flags):
            documented[flag] = (envs[i] if i < len(envs) else envs[0], defaults[i] if i < len(defaults) else "")
    serve = cli.build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {o for action in serve._actions for o in action.option_strings if o.startswith("--")} - {"--help"}
    known = {setting.flag: setting for setting in (*settings.SERVE, *settings.RULES)}
    assert flags == set(known), "a serve flag that is not a settings.Setting"
    for flag, setting in known.items():
        assert flag in documented, f"README's Configuration table lacks {flag}"
        env, default = documented[flag]
        assert env == setting.env, f"{flag}: README says {env}, the settings {setting.env}"
        if default:  # unset ones read "unset" or "in-cluster", outside backticks
            assert default == setting.shown, f"{flag}: README says {default}, the settings {setting.shown}"


def _chart_value_rows() -> list[tuple[set[str], str]]:
    """docs/operating.md's "Helm chart values" rows: the values each names in full (`.memory` after
    `resourceNames.vgpu` is resourceNames.memory), and the row's text."""
    text = (README.parent / "docs" / "operating.md").read_text()
    rows = []
    for row in (line for line in _section(text, "Helm chart values").splitlines() if line.startswith("| `")):
        names, parent = set(), ""
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            full = parent + name if name.startswith(".") else name
            parent = full.rsplit(".", 1)[0] if "." in full else ""
            names.add(full.removesuffix(".*"))
        rows.append((names, row))
    return rows


def test_operating_chart_values_table_names_each_values_flag() -> None:
    """Where the table documents a value that sets a flag of `serve` (admission/chart.py), the row names the
    flag, so a reader who is told to set the flag finds its value and the other way round."""
    for flag, value in chart.VALUES.items():
        rows = [row for names, row in _chart_value_rows()
                if any(name == value or name.startswith(value + ".") for name in names)]
        assert rows, f"docs/operating.md's chart values table has no row for {value} ({flag})"
        assert any(f"`{flag}" in row for row in rows), f"docs/operating.md's row for {value} does not name {flag}"


def test_operating_chart_values_table_names_every_value_of_the_chart() -> None:
    """docs/operating.md's "Helm chart values" is written by hand: every value of values.yaml has a row (a row
    may name a map as a whole, e.g. `resources`, or `prometheusRule.thresholds.*`), and no row names a value
    the chart does not have."""
    root = README.parent
    values = yaml.safe_load((root / "charts" / "hami-mt-webhook" / "values.yaml").read_text())
    leaves: list[str] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        else:
            leaves.append(path)

    walk(values, "")
    documented = {name for names, _ in _chart_value_rows() for name in names}
    for leaf in leaves:
        parts = leaf.split(".")
        assert any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1)), \
            f"docs/operating.md's chart values table lacks {leaf}"
    for name in documented:
        node: object = values
        for part in name.split("."):
            assert isinstance(node, dict) and part in node, f"docs/operating.md names {name}, not a chart value"
            node = node[part]
