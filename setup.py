"""The build: pyproject.toml holds the metadata; this compiles the rules (`hami_mt_webhook/rules`) with mypyc.

The rules are pure, strictly typed Python, and a review spends most of its time in them; compiled, a review
costs less (docs/PERFORMANCE.md, "Issue 24", part 3: the figures). The wheel and the image are built this way.
`HAMI_MT_PURE_PYTHON=1` builds without compiling: `make setup` installs the development checkout so, where an
edited rule must take effect at once and a compiled module left from before would hide it.
"""

import os
from pathlib import Path

from setuptools import setup

ext_modules = []
if os.environ.get("HAMI_MT_PURE_PYTHON") != "1":
    from mypyc.build import mypycify

    rules = sorted(str(p) for p in Path("hami_mt_webhook", "rules").glob("*.py"))
    # mypy finds installed packages through the interpreter that runs it, not through pip's isolated build
    # environment, so what a machine has installed would decide what compiles. --no-site-packages makes
    # the build the same everywhere: the rules' one outside import (orjson) is always untyped (Any) here.
    # One shared library for the group, at the top of the wheel: hami_mt_webhook__mypyc.
    ext_modules = mypycify(["--no-site-packages", "--ignore-missing-imports", *rules],
                           opt_level="3", group_name="hami_mt_webhook")

setup(ext_modules=ext_modules)
