"""The release notes of one version: its section of CHANGELOG.md (Keep a Changelog).

`python -m devtools.release.changelog 0.1.0 [--file CHANGELOG.md]` prints them, for the release step's notes; a
version without a section, or with an empty one, stops the release with the versions the file has.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from devtools.paths import CHANGELOG

#: A version's heading: `## [0.1.0] - 2026-12-05`, `## [Unreleased]` (the brackets and the date optional).
_HEADING = re.compile(r"^## +\[?(?P<version>[^\]\s]+)\]?(?: +- +\S.*)?$")
#: Keep a Changelog's link definitions at the end of the file (`[0.1.0]: https://...`), not notes.
_LINK = re.compile(r"^\[[^\]]+\]: +\S+$")


class ChangelogError(LookupError):
    """The changelog has no notes for the version asked for."""


def _versions(text: str) -> list[tuple[str, int]]:
    """Each version heading of `text`, with the index of its line."""
    found = []
    for i, line in enumerate(text.splitlines()):
        m = _HEADING.match(line.rstrip())
        if m:
            found.append((m["version"], i))
    return found


def section(text: str, version: str) -> str:
    """The notes of `version` (`0.1.0`, `v0.1.0` or `Unreleased`) in the changelog `text`: the lines under its
    `## [version]` heading up to the next `## ` heading, without surrounding blank lines or the link
    definitions that close the file. Raises ChangelogError naming the versions there are when `version` has
    no section or an empty one."""
    wanted = version.strip()
    wanted = wanted[1:] if re.match(r"^v\d", wanted) else wanted
    lines = text.splitlines()
    headings = _versions(text)
    known = [v for v, _ in headings]
    for n, (name, start) in enumerate(headings):
        if name.lower() != wanted.lower():
            continue
        end = headings[n + 1][1] if n + 1 < len(headings) else len(lines)
        body = lines[start + 1:end]
        while body and (not body[-1].strip() or _LINK.match(body[-1].strip())):
            body.pop()
        notes = "\n".join(body).strip("\n")
        if not notes.strip():
            raise ChangelogError(f"the changelog's section of {version} is empty")
        return notes + "\n"
    raise ChangelogError(f"the changelog has no section for {version} (add `## [{wanted}] - <date>`); "
                         f"it has: {', '.join(known) or 'none'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.release.changelog", description=__doc__.splitlines()[0])
    parser.add_argument("version", help="e.g. 0.1.0 or v0.1.0")
    parser.add_argument("--file", type=Path, default=CHANGELOG, help="the changelog (default: CHANGELOG.md)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(section(args.file.read_text(), args.version))
    except (ChangelogError, OSError) as e:
        print(f"changelog: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
