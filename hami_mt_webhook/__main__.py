"""`python -m hami_mt_webhook`: the same as the `hami-mt-webhook` command."""

import sys

from .cli.main import main

sys.exit(main())
