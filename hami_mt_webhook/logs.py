"""Logging: one JSON object per line by default; allowed no-ops are never logged."""

from __future__ import annotations

import json
import logging
import sys

#: Extra fields the webhook's own log lines carry (see server._log).
FIELDS = ("webhook", "kind", "namespace", "object", "uid", "dry_run", "reason", "warnings")


class JsonLines(logging.Formatter):
    """A small JSON formatter: known fields only, so foreign records (kopf's) can never break it."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for name in FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf's per-object and aiohttp's per-request lines would repeat on every review and node event.
    for noisy in ("kopf.objects", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
