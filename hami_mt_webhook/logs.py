"""Logging: JSON lines by default, quiet for allowed no-ops."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def setup(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"levelname": "level", "asctime": "time"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf's per-object and aiohttp's per-request lines would repeat on every review and node event.
    for noisy in ("kopf.objects", "aiohttp.access", "kopf._core.reactor.running"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
