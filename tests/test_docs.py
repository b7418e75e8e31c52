"""Documentation that states what the code does is checked against the code, so the two cannot drift.

(The messages quoted in docs/ are checked in test_examples.py; the log fields in test_logs.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

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
