"""`python -m devtools.bench`: see devtools/bench/main.py."""

import sys

from .main import main

sys.exit(main())
