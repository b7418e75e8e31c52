"""devtools.release.changelog: one version's release notes out of CHANGELOG.md."""

from __future__ import annotations

import pytest

from devtools import paths
from devtools.release import changelog

TEXT = """# Changelog

Intro text, not a version.

## [Unreleased]

### Added

- something new

## [0.2.0] - 2027-01-10

### Fixed

- a fix
  over two lines

## [0.1.0] - 2026-12-05

### Added

- the first release

[0.2.0]: https://example.com/compare/v0.1.0...v0.2.0
[0.1.0]: https://example.com/releases/v0.1.0
"""


def test_a_version_is_its_lines_up_to_the_next_heading() -> None:
    assert changelog.section(TEXT, "0.2.0") == "### Fixed\n\n- a fix\n  over two lines\n"


def test_a_tag_names_the_version_too() -> None:
    assert changelog.section(TEXT, "v0.2.0") == changelog.section(TEXT, "0.2.0")


def test_the_last_section_ends_before_the_link_definitions() -> None:
    assert changelog.section(TEXT, "0.1.0") == "### Added\n\n- the first release\n"


def test_unreleased_is_a_section() -> None:
    assert changelog.section(TEXT, "Unreleased") == "### Added\n\n- something new\n"


def test_a_version_without_a_section_names_the_versions_there_are() -> None:
    known = r"it has: Unreleased, 0\.2\.0, 0\.1\.0"
    with pytest.raises(changelog.ChangelogError, match=r"no section for 0\.3\.0 .*" + known):
        changelog.section(TEXT, "0.3.0")
    with pytest.raises(changelog.ChangelogError, match="no section for 0.2"):  # no prefix match
        changelog.section(TEXT, "0.2")


def test_an_empty_section_is_refused() -> None:
    with pytest.raises(changelog.ChangelogError, match="section of 1.0.0 is empty"):
        changelog.section("## [1.0.0] - 2027-02-01\n\n## [0.1.0]\n\n- x\n", "1.0.0")


def test_the_repositorys_changelog_has_the_first_release_and_unreleased() -> None:
    text = paths.CHANGELOG.read_text()
    assert "signed" in changelog.section(text, "0.1.0")
    assert "\n## [Unreleased]\n" in text  # where the next release's changes are written


def test_main_prints_the_notes_or_fails_with_a_message(tmp_path, capsys) -> None:
    path = tmp_path / "CHANGELOG.md"
    path.write_text(TEXT)
    assert changelog.main(["v0.1.0", "--file", str(path)]) == 0
    assert capsys.readouterr().out == "### Added\n\n- the first release\n"
    assert changelog.main(["9.9.9", "--file", str(path)]) == 2
    assert "no section for 9.9.9" in capsys.readouterr().err
