"""requirements/image.lock, which the image installs from with --require-hashes, agrees with pyproject.toml."""

from __future__ import annotations

import re
import tomllib

from devtools.paths import REPO_ROOT

LOCK = REPO_ROOT / "requirements" / "image.lock"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def pinned(lines: list[str]) -> dict[str, str]:
    """`name==version` requirements, by normalised name."""
    found = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^]]*\])?\s*==\s*([^\s;\\]+)", line)
        if m:
            found[_name(m[1])] = m[2]
    return found


def test_every_dependency_is_locked_at_its_pinned_version():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = pinned(project["dependencies"])
    assert len(wanted) == len(project["dependencies"]), "every runtime dependency is pinned with =="
    locked = pinned(LOCK.read_text().splitlines())
    wrong = {name: (version, locked.get(name)) for name, version in wanted.items() if locked.get(name) != version}
    assert not wrong, f"pyproject.toml and {LOCK.name} disagree (name: (wanted, locked)); run `make lock`: {wrong}"


def test_the_lock_holds_hashes_and_no_cluster_client():
    text = LOCK.read_text()
    entries = re.findall(r"^[a-z0-9].*?(?=^[a-z0-9]|\Z)", text, re.M | re.S)  # a requirement and its lines
    assert entries
    for entry in entries:
        assert "--hash=sha256:" in entry, entry.splitlines()[0]
    assert "make lock" in text.split("\n", 8)[4]  # how to regenerate it, at the top
    assert "kubernetes" not in pinned(text.splitlines())  # doctor's extra, not the image's
