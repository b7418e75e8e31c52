"""The shipped dashboard: one JSON file, the component's ConfigMap carrying it unchanged, every query
readable and naming metrics this webhook exports (the e2e tier evaluates them against a real scrape)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from devtools.clusters import manifests, monitoring
from devtools.paths import REPO_ROOT
from hami_mt_webhook.service.metrics import Metrics

OPERATING = REPO_ROOT / "docs" / "operating.md"
#: Sample names each metric type exports: what a query may name.
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    return monitoring.dashboard()


def exported() -> set[str]:
    """Every sample name the webhook's registry can export, series or not."""
    return {family.name + suffix for family in Metrics().registry.collect() for suffix in SUFFIXES[family.type]}


def test_the_component_carries_the_charts_dashboard_unchanged(board: dict[str, Any]) -> None:
    (doc,) = manifests.load(monitoring.COMPONENT / "dashboard.yaml")
    assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = doc["data"].values()
    assert json.loads(text) == board


def test_every_query_names_metrics_the_webhook_exports(board: dict[str, Any]) -> None:
    """A renamed metric fails here before it reaches a cluster; the API server's and Prometheus's own
    metrics are held to a real scrape in tests/e2e/test_monitoring.py."""
    names = exported()
    queries = monitoring.dashboard_queries(board) + [
        (a["alert"], a["expr"]) for a in monitoring.alerts(monitoring.component_rules())]
    seen = set()
    for title, expr in queries:
        found, _ = monitoring.selectors(expr)
        assert found, title
        for selector in found:
            if selector.metric.startswith("hami_mt_webhook_"):
                assert selector.metric in names, f"{title}: {selector.metric}"
                seen.add(selector.metric)
            else:
                assert selector.metric.startswith("apiserver_admission_webhook_") or selector.metric == "up", title
    assert len(seen) >= 15  # the dashboard and the alerts cover the webhook's metrics, not a few of them


def test_every_panel_is_described_in_the_docs(board: dict[str, Any]) -> None:
    text = OPERATING.read_text()
    section = text[text.index("**The dashboard**"):text.index("#### What each alert means")]
    described = set(re.findall(r"^\| ([^|]+?) \|", section, re.M)) - {"panel"}
    titles = {p["title"] for p in board["panels"] if p["type"] != "row"}
    assert titles == described


def test_every_panel_queries_through_the_datasource_variable(board: dict[str, Any]) -> None:
    """So the dashboard works with whichever Prometheus Grafana names, not one datasource uid."""
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert {p["datasource"]["uid"] for p in panels} == {"${datasource}"}
    assert all(t["datasource"]["uid"] == "${datasource}" for p in panels for t in p["targets"])
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
