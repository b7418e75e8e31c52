"""Documentation that states what the code does is checked against the code, so the two cannot drift.

The docs (README.md, docs/*.md, the chart's README, certs/README.md) may name only Makefile targets, chart
values and `hami-mt-webhook` flags that exist, and only the number of webhook configurations an install
really creates; each checker below is a pure function of the text and the truth read from the tree at test
time (the Makefile, values.yaml, the CLI's parser, the rendered manifests), and each is shown to catch a
planted wrong name. (The messages quoted in docs/ are checked in test_examples.py; the log fields in
test_logs.py.)
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.paths import CHART, REPO_ROOT
from hami_mt_webhook.admission import chart
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.cli import settings
from tests.builders import subcommands

README = REPO_ROOT / "README.md"
#: Every document a user reads for how to run, install or configure this project.
DOCS = (README, *sorted((REPO_ROOT / "docs").glob("*.md")), CHART / "README.md", REPO_ROOT / "certs" / "README.md",
        REPO_ROOT / "CONTRIBUTING.md")
#: Top-level values of other charts the docs set (`--set`), not ours: HAMi's chart.
FOREIGN_VALUES = {"scheduler", "devices"}
#: A dotted span ending so is a file (`image.py`), not a value.
FILE_SUFFIXES = {"py", "yaml", "yml", "json", "md", "sh", "tpl", "txt", "toml"}
NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_configuration_table_lists_every_serve_setting_with_its_variable_and_default():
    table = [line for line in _section(README.read_text(), "Configuration").splitlines() if line.startswith("| `")]
    documented: dict[str, tuple[str, str]] = {}
    for row in table:
        names, envs, defaults = (re.findall(r"`([^`]+)`", cell) for cell in row.split("|")[1:4])
        for i, flag in enumerate(names):
            documented[flag] = (envs[i] if i < len(envs) else envs[0], defaults[i] if i < len(defaults) else "")
    serve = subcommands(cli.build_parser())["serve"]
    flags = {o for action in serve._actions for o in action.option_strings if o.startswith("--")} - {"--help"}
    known = {setting.flag: setting for setting in (*settings.SERVE, *settings.RULES)}
    assert flags == set(known), "a serve flag that is not a settings.Setting"
    assert set(documented) <= flags, f"README's Configuration table names {set(documented) - flags}, not flags"
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


# --- what the docs name, read out of their text -------------------------------------------------------------


def code(markdown: str) -> Iterator[str]:
    """The text inside fenced blocks (one line each, `\\` continuations joined) and inline code spans."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
    for block in fenced.findall(markdown):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            yield re.split(r"(?:^|\s)#", line, maxsplit=1)[0]  # a comment is prose
    yield from re.findall(r"`([^`\n]+)`", fenced.sub("", markdown))


def _words(command: str) -> list[str]:
    """A command's words up to the end of the command (a shell separator or comment)."""
    command = re.split(r"\s[;&|#]|[;&|)]\s|\s&&\s", f" {command} ")[0]
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in prose: words as written
        return command.split()


def make_targets_named(markdown: str) -> set[str]:
    """The targets of every `make ...` command in code: its words other than options and VAR=value."""
    named = set()
    for text in code(markdown):
        for found in re.finditer(r"(?:^|[\s(;&|`$])make((?:\s+[^\s;&|#)]+)*)", text):
            words = _words(found[1])
            skip = False
            for word in words:
                if skip:
                    skip = False
                elif word in ("-C", "-f", "-j", "-o", "-W"):
                    skip = True
                elif not word.startswith("-") and "=" not in word and re.fullmatch(r"[a-z][\w.-]*", word):
                    named.add(word)
    return named


def makefile_targets(makefile: str) -> set[str]:
    """Every target a Makefile defines (rules and .PHONY), not variables or file targets."""
    targets: set[str] = set()
    for line in makefile.replace("\\\n", " ").splitlines():
        rule = re.match(r"^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?![:=])", line)
        if rule:
            targets.update(name for name in rule[1].split() if name != ".PHONY")
        if line.startswith(".PHONY:"):
            targets.update(line.split(":", 1)[1].split())
    return targets


def chart_values_named(markdown: str, top_level: Iterable[str]) -> set[str]:
    """Chart values named in code: every `--set NAME=...` (helm's --set-string/-json/-file too) but other charts'
    (FOREIGN_VALUES), and every span that is a dotted path starting with one of our top-level values
    (`certManager.enabled`, `annotationGuard.enforcer=webhook`); `[i]` indices dropped."""
    tops = set(top_level)
    named = set()
    for text in code(markdown):
        for found in re.finditer(r"--set(?:-string|-json|-file)?[ =]'?([A-Za-z][\w.\[\]\\/-]*)=", text):
            name = re.sub(r"\[\d+\]", "", found[1])
            if name.split(".")[0] not in FOREIGN_VALUES:
                named.add(name)
        span = re.fullmatch(r"([a-z][A-Za-z0-9]*(?:\.[A-Za-z0-9_*-]+|\[\d+\])+)(?:\s*[=:].*)?", text.strip())
        if span and span[1].split(".")[0] in tops and span[1].rsplit(".", 1)[1] not in FILE_SUFFIXES:
            named.add(re.sub(r"\[\d+\]", "", span[1]))
    return named


def missing_value(name: str, values: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether `name` (dotted; `*` for any key, `\\.` an escaped dot) is no value of the chart. Keys under a
    free-form map (the schema's `additionalProperties` not false: labels, nodeSelector, resources.limits)
    are anyone's to name."""
    node: Any = values
    rules: Any = schema
    definitions = schema.get("definitions", {})
    for part in re.split(r"(?<!\\)\.", name):
        while isinstance(rules, dict) and "$ref" in rules:
            rules = definitions[rules["$ref"].rsplit("/", 1)[1]]
        props = rules.get("properties", {}) if isinstance(rules, dict) else {}
        if part == "*" and isinstance(node, dict):
            return False
        if isinstance(node, dict) and part in node:
            node, rules = node[part], props.get(part, {})
            continue
        extra = rules.get("additionalProperties", False) if isinstance(rules, dict) else False
        return extra is False
    return False


def subcommand_flags(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """Each subcommand's long options."""
    choices = subcommands(parser)
    return {name: {o for a in sub._actions for o in a.option_strings if o.startswith("--")}
            for name, sub in choices.items()}


def flags_named(markdown: str, commands: Iterable[str]) -> set[tuple[str, str]]:
    """(subcommand, --flag) for every flag written after `hami-mt-webhook <subcommand>` in code (a command
    line, or a container's command list `[hami-mt-webhook, serve, --flag]`)."""
    pattern = re.compile(rf"(?:^|[\s/\[,\"'])hami-mt-webhook[\s,\"']+({'|'.join(commands)})\b(.*)")
    named = set()
    for text in code(markdown):
        for found in pattern.finditer(text):
            for word in _words(re.sub(r"[\[\],\"']", " ", found[2])):
                if word.startswith("--"):
                    named.add((found[1], word.split("=", 1)[0]))
    return named


def webhook_configuration_counts(markdown: str) -> set[int]:
    """Every number written as "N webhook configurations" (a word or digits, up to two words between)."""
    words = "|".join(NUMBERS)
    found = re.findall(rf"\b({words}|\d+)\s+(?:[\w-]+\s+){{0,2}}?webhook\s+configurations\b", markdown, re.I)
    return {int(n) if n.isdigit() else NUMBERS[n.lower()] for n in found}


# --- the truth, read from the tree -----------------------------------------------------------------------


def _values() -> tuple[dict[str, Any], dict[str, Any]]:
    return (yaml.safe_load((CHART / "values.yaml").read_text()),
            json.loads((CHART / "values.schema.json").read_text()))


def _configurations(docs: Iterable[dict[str, Any]]) -> int:
    return sum(1 for d in docs if d and d.get("kind") in ("MutatingWebhookConfiguration",
                                                            "ValidatingWebhookConfiguration"))


def _doc_texts() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        yield str(path.relative_to(REPO_ROOT)), path.read_text()


# --- the docs against the truth --------------------------------------------------------------------------


def test_docs_name_only_makefile_targets_that_exist() -> None:
    targets = makefile_targets((REPO_ROOT / "Makefile").read_text())
    assert {"run", "test", "help", "test-release"} <= targets
    wrong = {(name, t) for name, text in _doc_texts() for t in make_targets_named(text) - targets}
    assert not wrong, f"make targets the Makefile does not have: {sorted(wrong)}"


def test_docs_name_only_chart_values_that_exist() -> None:
    values, schema = _values()
    wrong = {(name, v) for name, text in _doc_texts() for v in chart_values_named(text, values)
             if missing_value(v, values, schema)}
    assert not wrong, f"chart values values.yaml does not have: {sorted(wrong)}"


def test_docs_name_only_flags_the_cli_has() -> None:
    flags = subcommand_flags(cli.build_parser())
    wrong = {(name, sub, f) for name, text in _doc_texts() for sub, f in flags_named(text, flags)
             if f not in flags[sub]}
    assert not wrong, f"flags hami-mt-webhook does not have: {sorted(wrong)}"


@pytest.fixture(scope="module")
def base_configurations() -> int:
    """How many webhook configurations the kustomize base installs (`kubectl kustomize`)."""
    from tests.manifests.support import KUBECTL

    if KUBECTL is None:
        pytest.skip("no kubectl on PATH")
    out = subprocess.run([KUBECTL, "kustomize", str(REPO_ROOT / "manifests")], check=True, capture_output=True,
                         text=True).stdout
    return _configurations(yaml.safe_load_all(out))


def test_docs_name_the_number_of_webhook_configurations_an_install_creates(base_configurations: int) -> None:
    """The default install's number, from the rendered base (the chart's is the same: the e2e test below). A
    variant's is written as a difference ("six with components/guard-webhook"), which this does not read."""
    wrong = {(name, n) for name, text in _doc_texts() for n in webhook_configuration_counts(text)
             if n != base_configurations}
    assert not wrong, f"the install creates {base_configurations} webhook configurations; docs say {sorted(wrong)}"


ADMISSION_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                   "ValidatingAdmissionPolicyBinding"}


def deleted(markdown: str) -> set[tuple[str, str]]:
    """(kind in lower case, name) of every `kubectl delete <kind> <name>...` in code."""
    gone: set[tuple[str, str]] = set()
    for text in code(markdown):
        for found in re.finditer(r"kubectl delete ([a-z]+)((?:\s+[a-z0-9-]+)+)", text):
            gone.update((found[1], name) for name in found[2].split() if not name.startswith("-"))
    return gone


def test_going_back_deletes_every_admission_object_before_the_deployment(tmp_path: Path) -> None:
    """docs/migration.md's "Going back": every webhook configuration, policy and binding the base installs,
    with any component (the warn copies, the guard as a webhook), so none is left to refuse pods."""
    from tests.manifests.support import KUBECTL, with_components

    if KUBECTL is None:
        pytest.skip("no kubectl on PATH")
    section = _section((REPO_ROOT / "docs" / "migration.md").read_text(), "Going back")
    installed = {(d["kind"].lower(), d["metadata"]["name"])
                 for docs in (with_components(tmp_path / "a", "warn"), with_components(tmp_path / "b", "guard-webhook"))
                 for d in docs if d["kind"] in ADMISSION_KINDS}
    assert len(installed) >= 10
    assert installed - deleted(section) == set(), "Going back leaves these installed"
    assert section.index("kubectl delete mutatingwebhookconfiguration") < section.index("helm uninstall")


@pytest.mark.e2e
def test_the_chart_creates_as_many_webhook_configurations_as_the_base(base_configurations: int) -> None:
    from devtools.builds.binaries import binaries

    out = subprocess.run([str(binaries() / "helm"), "template", "hami-mt-webhook", str(CHART), "-n",
                          "hami-mt-webhook"], check=True, capture_output=True, text=True).stdout
    assert _configurations(yaml.safe_load_all(out)) == base_configurations


def test_metrics_table_lists_every_registered_metric() -> None:
    """docs/operating.md's Metrics table against what the process registers (counters with `_total`)."""
    from hami_mt_webhook.service.metrics import Metrics

    exposed = re.findall(r"^# TYPE (\S+) ", Metrics().render().decode(), re.M)
    registered = {name for name in exposed if not name.endswith("_created")}  # a counter's start time
    assert "hami_mt_webhook_peer_verdicts_total" in registered
    section = _section((REPO_ROOT / "docs" / "operating.md").read_text(), "Metrics")
    documented = {m for m in re.findall(r"^\| `(hami_mt_webhook_\w+)`", section, re.M)}
    assert registered - documented == set(), "registered but not in docs/operating.md's Metrics table"
    assert documented - registered == set(), "in docs/operating.md's Metrics table but not registered"


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings (lower case, punctuation dropped, spaces as `-`)."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(next(f"{slug}-{n}" if n else slug for n in range(len(anchors) + 1)
                         if (f"{slug}-{n}" if n else slug) not in anchors))  # a repeat gets -1, -2, ...
    return anchors

def test_links_to_a_section_find_it() -> None:
    """A figure moved to docs/PERFORMANCE.md is reached by a link to its section: every `[...](file.md#x)`
    and `[...](#x)` in the docs names a heading that exists."""
    wrong = []
    for doc in DOCS:
        for target, name in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
            path = (doc.parent / target).resolve() if target else doc
            if path.suffix == ".md" and path.exists() and name not in heading_anchors(path.read_text()):
                wrong.append(f"{doc.relative_to(REPO_ROOT)}: {target}#{name}")
    assert not wrong, wrong
    assert {"builds-the-image-and-make-test-on-2-cores", "1-loopback-https-the-webhook-beside-a-bare-aiohttp-tls-server"
            } <= heading_anchors((REPO_ROOT / "docs" / "PERFORMANCE.md").read_text())
    assert "no-such-section" not in heading_anchors((REPO_ROOT / "docs" / "PERFORMANCE.md").read_text())


# --- each checker catches a planted wrong name ----------------------------------------------------------

PLANTED = """Run `make tset` or:

```sh
KUBE_VERSION=floor make test-e2e && make bench BENCH_ARGS="--parts http" COMPAT=1
make -C . lnit  # make sure
helm install hami-mt-webhook charts/hami-mt-webhook \\
  --set certManager.enabeld=true --set nodeSelector.kubernetes\\.io/os=linux --set scheduler.x=1
hami-mt-webhook doctor --kubeconfig k.yaml --retired-scheduler mt -o json
kubectl -n hami-mt-webhook logs deploy/hami-mt-webhook --since 1h
```

Set `annotationGuard.enforcr=webhook`, not `metadata.name`; `prometheusRule.thresholds.*` and
`resources.limits.memory` are fine. The container runs `[hami-mt-webhook, serve, --log-levl, debug]`.
It installs the three webhook configurations; all 5 pod webhook configurations.
"""


def test_make_checker_catches_a_target_that_does_not_exist() -> None:
    targets = makefile_targets((REPO_ROOT / "Makefile").read_text())
    named = make_targets_named(PLANTED)
    assert named == {"tset", "test-e2e", "bench", "lnit"}
    assert named - targets == {"tset", "lnit"}
    assert makefile_targets("a b: c\n\t@x\nV := 1\nW ?= 2\n$(X)/.y: z\n.PHONY: p\n") == {"a", "b", "p"}


def test_value_checker_catches_a_value_that_does_not_exist() -> None:
    values, schema = _values()
    named = chart_values_named(PLANTED, values)
    assert named == {"certManager.enabeld", "nodeSelector.kubernetes\\.io/os", "annotationGuard.enforcr",
                     "prometheusRule.thresholds.*", "resources.limits.memory"}
    assert {v for v in named if missing_value(v, values, schema)} == {"certManager.enabeld",
                                                                       "annotationGuard.enforcr"}


def test_flag_checker_catches_a_flag_that_does_not_exist() -> None:
    flags = subcommand_flags(cli.build_parser())
    named = flags_named(PLANTED, flags)
    assert named == {("doctor", "--kubeconfig"), ("doctor", "--retired-scheduler"), ("serve", "--log-levl")}
    assert {(sub, f) for sub, f in named if f not in flags[sub]} == {("doctor", "--retired-scheduler"),
                                                                     ("serve", "--log-levl")}


def test_count_checker_catches_a_wrong_number() -> None:
    assert webhook_configuration_counts(PLANTED) == {3, 5}  # words and digits; 3 is no install's count


def test_make_help_lists_every_described_target_and_is_the_default_goal() -> None:
    """A bare `make` is `make help` (nothing built), and help names every target with a `##` description."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    described = dict(re.findall(r"^([a-zA-Z0-9_-]+):[^#=\n]*## *(.+)$", makefile, re.M))
    assert {"help", "run", "test", "release"} <= set(described)
    def make(*args: str) -> str:
        return subprocess.run(["make", "--no-print-directory", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                              check=True).stdout

    shown = make("help")
    for target, description in described.items():
        assert re.search(rf"^  {re.escape(target)} +{re.escape(description.strip())}$", shown, re.M), target
    assert make("-n") == make("-n", "help")
    first = README.read_text().split("```sh\n", 1)[1].splitlines()[:2]
    assert [line.split("#")[0].strip() for line in first] == ["make run", "make test"], first
