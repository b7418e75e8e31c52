"""The shipped alerts and dashboard, and a real Prometheus to run them (tests, `make run PROMETHEUS=1`).

The chart is their one home (files/prometheus-rules.yaml, files/dashboard.json); the kustomize component
manifests/components/monitoring is the chart's rendering with default values, written by
devtools.clusters.shipped (`make shipped`) and checked by `make check`. `selectors` reads which metrics and labels
an expression names, so a test can hold every rule and panel to what a real scrape has.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools import procs
from devtools.clusters import manifests
from devtools.paths import CHART
from devtools.waiting import NotWithin, until

__all__ = ["CHART", "COMPONENT", "COMPONENT_FILES", "DASHBOARD_FILE", "JOB", "MONITOR_API", "NAMESPACE",
           "RULE_API", "Prometheus", "Selector", "alerts", "component_rules", "dashboard", "dashboard_queries",
           "scrape_configs", "selectors", "tool"]

DASHBOARD_FILE = CHART / "files" / "dashboard.json"
COMPONENT = manifests.base_dir() / "components" / "monitoring"
#: What the cluster must serve for the chart to render its PrometheusRule.
RULE_API = "monitoring.coreos.com/v1/PrometheusRule"
MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
#: The component's files, each named as the chart template it is rendered from (devtools.clusters.shipped).
COMPONENT_FILES = ("servicemonitor.yaml", "prometheusrule.yaml", "dashboard.yaml")
#: The job of the webhook's targets: the Service's name, as the Prometheus operator names a ServiceMonitor's.
JOB = "hami-mt-webhook"
NAMESPACE = "hami-mt-webhook"
#: Grafana's own variables, and what a query gets for them outside Grafana.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def tool(name: str) -> str:
    """The path of `prometheus` or `promtool` (Debian's package `prometheus`; `make prometheus` installs it)."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH: `make prometheus` installs Debian's package prometheus")
    return path


# --- the shipped objects -----------------------------------------------------------------------------------


def component_rules() -> dict[str, Any]:
    """The rule groups of the component's PrometheusRule: a Prometheus rule file's content."""
    (doc,) = manifests.load(COMPONENT / "prometheusrule.yaml")
    spec: dict[str, Any] = doc["spec"]
    return spec


def alerts(groups: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in groups["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every query, Grafana's interval variables replaced."""
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            out.append((panel["title"], expr))
    return out


# --- what an expression names ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """A series selector: the metric, and its matchers as (label, operator, quoted value)."""
    metric: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(label for label, _, _ in self.matchers)

    def matching(self, label: str, op: str, value: str) -> str:
        """This metric with one of its matchers alone, as a selector."""
        return f"{self.metric}{{{label}{op}{value}}}"


_TOKEN = re.compile(r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<duration>\[[^\]]*\])
  | (?P<number>(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:ms|[smhdwy])?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<punct>[{}(),])
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=])
  | (?P<space>\s+)
""", re.VERBOSE)
#: Words that are not metric names where a metric name could stand.
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "inf", "nan", "atan2", "sum", "min", "max", "avg", "group", "stddev",
                       "stdvar", "count", "count_values", "bottomk", "topk", "quantile"})
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


def selectors(expr: str) -> tuple[list[Selector], set[str]]:
    """The series selectors of a PromQL expression, and the label names its grouping clauses name
    (`by (le)`, `on (instance)`). Enough PromQL for the shipped rules and panels; an expression this
    cannot read raises rather than passing unread."""
    tokens = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
    found: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in _GROUPING:
            if following == "(":
                i += 2
                while tokens[i][1] != ")":
                    if tokens[i][0] == "ident":
                        grouping.add(tokens[i][1])
                    i += 1
            i += 1
            continue
        if kind == "ident" and text not in _KEYWORDS and following != "(":
            matchers: list[tuple[str, str, str]] = []
            if following == "{":
                i += 2
                while tokens[i][1] != "}":
                    if tokens[i][0] == "ident" and tokens[i + 1][1] in ("=", "!=", "=~", "!~"):
                        matchers.append((tokens[i][1], tokens[i + 1][1], tokens[i + 2][1]))
                        i += 2
                    i += 1
            found.append(Selector(text, tuple(matchers)))
        elif kind == "punct" and text == "{":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        i += 1
    return found, grouping


# --- a real Prometheus -------------------------------------------------------------------------------------


class Prometheus:
    """`prometheus` on a loopback port of its own, with its own data directory under `workdir`, scraping
    `scrape_configs` and evaluating `rule_files` every `interval`."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path],
                 interval: str = "2s") -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = procs.free_port()
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files], "scrape_configs": scrape_configs}))
        self.log = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Prometheus:
        proc = self.proc = procs.spawn([tool("prometheus"), f"--config.file={self.config}",
                                        f"--storage.tsdb.path={self.workdir / 'data'}",
                                        f"--web.listen-address=127.0.0.1:{self.port}",
                                        "--web.console.templates=/nonexistent",
                                        "--web.console.libraries=/nonexistent", "--log.level=warn"], self.log)

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{procs.tail(self.log)}")
            try:
                with self._open("/-/ready") as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            until("prometheus ready", ready, timeout, 0.2)
        except NotWithin as e:
            self.stop()
            raise NotWithin(f"{e}:\n{procs.tail(self.log)}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            procs.terminate(self.proc)

    def _open(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        return opener.open(f"{self.url}{path}{query}", timeout=10)

    def api(self, path: str, **params: str | list[str]) -> Any:
        """An /api/v1 answer's data; an error answer raises with Prometheus's own message."""
        pairs = [(k, v) for k, vs in params.items() for v in ([vs] if isinstance(vs, str) else vs)]
        try:
            with self._open(f"/api/v1/{path}", pairs) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else [data]
        return result

    def label_names(self, selector: str, since: float) -> set[str]:
        """Every label name of the series `selector` picks since `since` (empty: no such series)."""
        series = self.api("series", **{"match[]": selector, "start": f"{since:.3f}"})
        return {name for s in series for name in s}

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return active

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]


def scrape_configs(webhook_metrics: str, apiserver: str, credentials: Path) -> list[dict[str, Any]]:
    """The webhook's metrics port as the ServiceMonitor's job would see it, and kube-apiserver's /metrics
    with the admin client certificate in `credentials` (ca.crt, admin.crt, admin.key)."""
    return [
        {"job_name": JOB, "honor_labels": True,  # the ServiceMonitor's honorLabels
         "static_configs": [{"targets": [webhook_metrics], "labels": {"namespace": NAMESPACE}}]},
        {"job_name": "apiserver", "scheme": "https",
         "static_configs": [{"targets": [urllib.parse.urlsplit(apiserver).netloc]}],
         "tls_config": {"ca_file": str(credentials / "ca.crt"), "cert_file": str(credentials / "admin.crt"),
                        "key_file": str(credentials / "admin.key")}},
    ]

