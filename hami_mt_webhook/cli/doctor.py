"""`doctor`: read-only checks of the cluster of the current kubeconfig (or in-cluster), one line per finding.

Exit 0: nothing needs action (notes may be printed); 1: something does; 2: doctor cannot run (no
credentials, the API server unreachable or refusing a list it needs), with one line on stderr.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from ..doctor import checks, fetch
from ..rules.config import Config


def run_doctor(kubeconfig: str | None, config: Config, output: str = "text",
               pending_minutes: float = 5.0) -> int:
    settings = checks.Settings(config=config, pending=dt.timedelta(minutes=pending_minutes))
    # Quiet while it runs: the HTTP client logs its retries and the rules log odd node reports (once per
    # node, for the server's log); doctor says what matters in its own lines instead.
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        cluster = fetch.read(fetch.Api(kubeconfig))
        findings = checks.run(cluster, settings)
    except fetch.CannotRun as err:
        print(f"hami-mt-webhook doctor: {err}", file=sys.stderr)
        return 2
    finally:
        logging.disable(before)
    for finding in findings:
        print(json.dumps(finding.as_json()) if output == "json" else finding.line())
    actions = sum(f.action for f in findings)
    if output == "text":
        print(f"{len(checks.CHECKS)} checks: {actions} finding{'s' if actions != 1 else ''} to act on, "
              f"{len(findings) - actions} note{'s' if len(findings) - actions != 1 else ''}", file=sys.stderr)
    return 1 if actions else 0
