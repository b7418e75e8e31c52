"""`python -m devtools.release`: see devtools/release/__init__.py."""

from devtools.release import main

raise SystemExit(main())
