"""The shipped alerts as Prometheus runs them: real promtool checks the rendered rules and runs
alerts.test.yaml, series that fire each alert and series that must not, against them.

The rules tested are manifests/components/monitoring/prometheusrule.yaml, the chart's rendering with its
default values (tests/e2e/test_chart.py holds the two equal, and checks other thresholds render too)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import monitoring
from tests.manifests.support import CONFIGS

HERE = Path(__file__).resolve().parent
TESTS = HERE / "alerts.test.yaml"
OPERATING = HERE.parents[1] / "docs" / "operating.md"
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module")
def groups() -> dict[str, Any]:
    return monitoring.component_rules()


@pytest.fixture
def rules_dir(tmp_path: Path, groups: dict[str, Any]) -> Path:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    return tmp_path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([monitoring.tool("promtool"), *args], capture_output=True, text=True, cwd=cwd)


def test_promtool_accepts_the_rules(rules_dir: Path, groups: dict[str, Any]) -> None:
    done = promtool("check", "rules", "rules.yaml", cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(monitoring.alerts(groups))} rules found" in done.stdout


def test_every_alert_fires_and_stays_quiet_as_its_tests_say(rules_dir: Path) -> None:
    done = promtool("test", "rules", TESTS.name, cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_would_catch_a_broken_rule(rules_dir: Path) -> None:
    """The tests fail when a rule changes: a misspelt metric never fires, silently, unless a test says so."""
    text = (rules_dir / "rules.yaml").read_text()
    (rules_dir / "rules.yaml").write_text(text.replace("hami_mt_webhook_ready ==", "hami_mt_webhook_readyy =="))
    done = promtool("test", "rules", TESTS.name, cwd=rules_dir)
    assert done.returncode != 0 and "HamiMtWebhookNotReady" in done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_case(groups: dict[str, Any]) -> None:
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    names = {a["alert"] for a in monitoring.alerts(groups)}
    assert set(cases) == names  # a case for a name no rule has would pass, empty, forever
    assert all(True in seen and False in seen for seen in cases.values()), cases


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_says_how_bad_what_is_wrong_and_where_its_runbook_is(groups: dict[str, Any]) -> None:
    anchors = {github_anchor(line.lstrip("#")) for line in OPERATING.read_text().splitlines()
               if line.startswith("#")}
    for alert in monitoring.alerts(groups):
        assert alert["labels"]["severity"] in SEVERITIES, alert["alert"]
        assert len(alert["annotations"]["summary"]) > 40, alert["alert"]
        url, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert url.endswith("docs/operating.md") and anchor == alert["alert"].lower(), alert["alert"]
        assert anchor in anchors, f"docs/operating.md has no section for {alert['alert']}"


def test_the_api_servers_view_covers_every_webhook_of_this_project(groups: dict[str, Any]) -> None:
    """The API server's metrics name webhooks, not replicas: the rules' name pattern must take each of the
    shipped webhook names and no other's."""
    names = [hook for hooks in CONFIGS.values() for hook, _ in hooks]
    patterns = {m for a in monitoring.alerts(groups) for m in re.findall(r'name=~"([^"]+)"', a["expr"])}
    assert len(patterns) == 1
    (pattern,) = patterns
    assert all(re.fullmatch(pattern, n) for n in names)
    assert not re.fullmatch(pattern, "mutate.hami-mt.mthreads.com.evil.example.com")
    assert not re.fullmatch(pattern, "vgpu.hami.io")
