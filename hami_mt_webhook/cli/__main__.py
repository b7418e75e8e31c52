"""`python -m hami_mt_webhook.cli`: the same as the `hami-mt-webhook` command."""

import sys

from .main import main

sys.exit(main())
