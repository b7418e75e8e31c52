"""`python -m devtools.bench`: see devtools/bench/cli.py."""

import sys

from .cli import main

sys.exit(main())
