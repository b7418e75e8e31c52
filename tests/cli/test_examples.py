"""The examples and their expected `review -o json` output, so the docs quoting them cannot drift.

Each `examples/<name>.yaml` (but nodes.yaml) has `examples/expected/<name>.json`, one line per document,
written by `hami-mt-webhook review --nodes examples/nodes.yaml -o json` and reviewed against SPEC.md.
After a deliberate change of a message, regenerate with:

    for f in examples/*.yaml; do n=$(basename "$f" .yaml); [ "$n" = nodes ] && continue
      hami-mt-webhook review -f "$f" --nodes examples/nodes.yaml -o json > "examples/expected/$n.json"; done
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from devtools.paths import REPO_ROOT
from hami_mt_webhook.cli import main as cli

EXAMPLES = REPO_ROOT / "examples"
EXPECTED = EXAMPLES / "expected"
NODES = EXAMPLES / "nodes.yaml"
FILES = sorted(p for p in EXAMPLES.glob("*.yaml") if p != NODES)
DOCS = REPO_ROOT / "docs"


def review(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["review", "-f", str(path), "--nodes", str(NODES), "-o", "json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_example_review_matches_expected(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = review(path, capsys)
    expected = (EXPECTED / f"{path.stem}.json").read_text()
    assert err == ""
    assert [json.loads(line) for line in out.splitlines()] == [json.loads(line) for line in expected.splitlines()]
    assert out == expected, "same objects, different bytes: regenerate the expected file"
    # A file is named for its verdict: "denied" in the name exactly when some document is denied.
    assert code == (1 if "denied" in path.stem else 0)
    assert all(json.loads(line)["allowed"] is ("denied" not in path.stem) for line in out.splitlines())


def test_every_expected_file_has_its_example() -> None:
    assert sorted(p.stem for p in EXPECTED.glob("*.json")) == sorted(p.stem for p in FILES)


def test_examples_cover_every_rule() -> None:
    """Each rule's reason (denials) or kind of change (warnings) appears in some expected output."""
    text = "\n".join(p.read_text() for p in EXPECTED.glob("*.json"))
    for fragment in (
        "snapped up to",  # snap
        "vgpu 1 added",  # vendor form
        "set only in requests; copied to limits",  # requests only
        "alone takes a whole card",  # exclusive
        "takes 2 whole cards",  # multi-card
        "without mthreads.com/sgpu-core",  # memory without core
        "leaves it unchanged",  # another scheduler
        "is more than the largest card",  # too big
        "without mthreads.com/sgpu-memory: add",  # core without memory
        "multi-card requests take whole cards",  # multi-card with extra values
        "is more than any node it could run on has",  # more cards than a node has
        "share one card but ask for",  # two containers over one card
        "spec.nodeName",  # nodeName
        "is privileged",  # privileged
        "label skips the mutation only",  # a pod's own ignore label (4.8)
        "is a byte size",  # quantities
        "differ; set them to the same value",  # limits != requests
        "and the device plugins when the pod is bound and must not be set on a new pod",  # owned annotations
        "(whole cards, outside HAMi)",  # mixing
        '"kind":"Deployment"',  # a Deployment
        '"kind":"CronJob"',  # a CronJob
    ):
        assert fragment in text, fragment


def _quoted_messages(page: Path) -> list[str]:
    """Lines of the page's fenced `text` blocks (the messages it quotes from real runs)."""
    blocks = re.findall(r"```text\n(.*?)```", page.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _said() -> set[str]:
    """Every message and warning the examples print."""
    said: set[str] = set()
    for path in EXPECTED.glob("*.json"):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            if obj["message"]:
                said.add(obj["message"])
            said.update(obj["warnings"])
    return said


PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "SPEC.md")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_docs_quote_real_output(page: Path) -> None:
    """A ```text block in docs/ holds messages exactly as the examples print them, nothing invented."""
    missing = [q for q in _quoted_messages(page) if q not in _said()]
    assert not missing, f"quoted in {page.name} but not printed by any example: {missing}"


def test_denials_page_documents_every_denial() -> None:
    quoted = set(_quoted_messages(DOCS / "denials.md"))
    denied = {json.loads(line)["message"] for p in EXPECTED.glob("*.json") for line in p.read_text().splitlines()
              if not json.loads(line)["allowed"]}
    assert denied <= quoted, f"denials not documented: {sorted(denied - quoted)}"
    warned = {w for p in EXPECTED.glob("*.json") for line in p.read_text().splitlines()
              for w in json.loads(line)["warnings"]}
    assert warned <= quoted, f"warnings not documented: {sorted(warned - quoted)}"
