"""Logging: one JSON object per line by default; allowed no-ops are never logged.

A log line is written on every mutation and denial, so it sits on the admission hot path: lines are
serialized with orjson and written without a flush per line; a background thread flushes at least
every `FLUSH_SECONDS`, and at exit.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from typing import TextIO

import orjson

#: Extra fields the webhook's own log lines carry (see handler.log_decision).
FIELDS = ("webhook", "kind", "namespace", "object", "uid", "dry_run", "reason", "warnings")
FLUSH_SECONDS = 0.2


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
            with self.lock:  # type: ignore[union-attr]  # created in Handler.__init__ (createLock); typeshed allows None  # created in Handler.__init__ (createLock); typeshed allows None
                self.stream.write(line)
                self._dirty = True
            if record.levelno >= logging.ERROR:
                self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # created in Handler.__init__ (createLock); typeshed allows None
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


def setup(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    handler = BatchedStreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf's per-object and aiohttp's per-request lines would repeat on every review and node event.
    for noisy in ("kopf.objects", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
