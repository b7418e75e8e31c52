"""`make bench`: see devtools/bench/cli.py for the parts and options."""

from pathlib import Path

#: The repository: where the benchmark's own processes start and whose commit the report names.
REPO_ROOT = Path(__file__).resolve().parents[2]
