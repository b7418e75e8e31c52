"""Logging: one JSON object per line by default; allowed no-ops are never logged.

A log line is written on every mutation and denial, so it sits on the admission hot path: lines are
serialized with orjson and written without a flush per line; a background thread flushes at least
every `FLUSH_SECONDS`, and at exit. `decision` writes those lines without a `LogRecord` while the JSON
handler `setup` installed is the only one (about a fifth of a review's cost went to the record); the
line is the same as `JsonLines` writes.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from typing import Any, TextIO

import orjson

__all__ = ["setup", "JsonLines"]

#: Extra fields the webhook's own log lines carry (see handler.log_decision).
FIELDS = ("webhook", "kind", "namespace", "object", "uid", "dry_run", "reason", "warnings")
FLUSH_SECONDS = 0.2


class JsonLines(logging.Formatter):
    """A small JSON formatter: known fields only, so foreign records (kopf's) can never break it."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": _stamp(record.created), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for name in FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class BatchedStreamHandler(logging.StreamHandler[TextIO]):
    """A StreamHandler that flushes on a timer rather than after every line.

    Errors and above are flushed at once: they may be the last thing a dying process says.
    """

    def __init__(self, stream: TextIO | None = None, interval: float = FLUSH_SECONDS) -> None:
        super().__init__(stream)
        self.interval = interval
        self._dirty = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="log-flush", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            # The lock is created in Handler.__init__ (createLock); typeshed allows None.
            with self.lock:  # type: ignore[union-attr]
                self.stream.write(line)
                self._dirty = True
            if record.levelno >= logging.ERROR:
                self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        # The lock is created in Handler.__init__ (createLock); typeshed allows None.
        with self.lock:  # type: ignore[union-attr]
            self._dirty = False
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()

    def _flusher(self) -> None:
        while not self._stop.wait(self.interval):
            if self._dirty:
                try:
                    self.flush()
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        self._stop.set()
        try:
            self.flush()
        except (OSError, ValueError):
            pass
        super().close()


_STAMP: list[Any] = [-1, ""]  # [the second, its "YYYY-mm-dd HH:MM:SS"], as logging's asctime shows it


def _stamp(created: float) -> str:
    """logging's default asctime ("2026-12-04 05:02:11,123", local time), the second formatted once."""
    second = int(created)
    if _STAMP[0] != second:
        _STAMP[0], _STAMP[1] = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
    return f"{_STAMP[1]},{int((created - second) * 1000):03d}"


#: The handler `setup` installed with the JSON format; `decision` writes to it directly while it is the
#: only one.
_JSON: BatchedStreamHandler | None = None


def decision(logger: logging.Logger, message: str, fields: dict[str, Any]) -> None:
    """One INFO line about a review (`handler.log_decision`): the JsonLines line, without a LogRecord
    when nothing else would see the record (tests capturing logs, another format) ."""
    handler = _JSON
    if handler is None or logging.root.handlers != [handler] or logger.handlers or not logger.propagate:
        logger.info("%s", message, extra=fields)
        return
    line = orjson.dumps({"time": _stamp(time.time()), "level": "INFO", "logger": logger.name,
                         "message": message, **{k: v for k, v in fields.items() if k in FIELDS}}, default=str)
    with handler.lock:  # type: ignore[union-attr]  # created in Handler.__init__ (createLock)
        handler.stream.write(line.decode() + handler.terminator)
        handler._dirty = True


def setup(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    global _JSON
    handler = BatchedStreamHandler(stream or sys.stderr)
    _JSON = handler if fmt == "json" else None
    handler.setFormatter(JsonLines() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf's per-object and aiohttp's per-request lines would repeat on every review and node event.
    for noisy in ("kopf.objects", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
