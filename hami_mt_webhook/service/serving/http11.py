"""HTTP/1.1 for one POST route, and for the probes' GETs, as pure functions: a request head in, an answer's
bytes out.

The webhook port serves kube-apiserver's POSTs of AdmissionReviews and nothing else, so the protocol
is the small part of HTTP/1.1 those need: a request line, headers, a body of known length, keep-alive.
Everything else gets a fixed answer that never echoes what the client sent: a malformed head 400, a
body without Content-Length 411, one over the limit 413, another method 405, another path 404, a request
line over its limit 414, a head over its limits 431. The probe and metrics ports take GETs without a body
of a few fixed paths (`parse_get`), with the same limits and the same fixed answers.
`connections` feeds bytes in; nothing here touches a socket.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import unquote

#: The `Server:` header: the name only, never a library or version.
SERVER_NAME = "hami-mt-webhook"

#: A request head longer than this, or with more header lines, is refused (Go's client sends about 250 bytes).
MAX_HEAD = 16 * 1024
MAX_HEADERS = 100
#: A request line longer than this is refused (kube-apiserver's is `POST /<webhook>?timeout=3s HTTP/1.1`).
MAX_REQUEST_LINE = 8 * 1024

_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_ROUTE = re.compile(r"/((?:warn/)?[^/]+)")


class BadRequest(Exception):
    """The request cannot be answered normally; `status` is the fixed answer, and the connection closes."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True, slots=True)
class Head:
    """What the server needs of a request head."""

    webhook: str  # the path without its leading slash: "mutate-pods", "warn/validate-pods"; "readyz"
    length: int
    encoding: str  # Content-Encoding, lower case; "" when absent
    keep_alive: bool
    expects_continue: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """What a responder answers: a status and a body (JSON, unless a probe's); `close` ends the connection after
    it."""

    status: int
    body: bytes
    close: bool = False
    content_type: bytes = b"application/json"


def head_end(buf: bytes | bytearray) -> int:
    """Where the request head at the start of `buf` ends (the index of its blank line), or -1 while it may
    still come; raises BadRequest past the limits (414 for the request line, then 431 for the head).

    The limits are judged on the bytes, never on how they were split into reads: a line or a head that
    has not ended within its limit is refused whether its end has arrived yet or not, so a client gets
    the same answer whatever the size of its TLS records."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if 0 <= end <= MAX_REQUEST_LINE:  # the usual head: both limits kept
        return end
    if buf.find(b"\r\n", 0, MAX_REQUEST_LINE + 2) < 0 and len(buf) >= MAX_REQUEST_LINE + 2:
        raise BadRequest(414)
    if end < 0 and len(buf) >= MAX_HEAD + 4:
        raise BadRequest(431)
    return end


def parse_head(head: bytes) -> Head:
    """Read a request head (the bytes before the blank line); raises BadRequest.

    One regex pass checks every header line (a token, a colon, visible characters), and one more finds
    the few headers the server reads: cheaper than a dict of every header, and a review's head is parsed
    on every request."""
    method, target, version, found = _read(head)
    webhook = _route(target)
    if method != b"POST":
        raise BadRequest(405)
    if b"transfer-encoding" in found:
        raise BadRequest(411)
    raw = found.get(b"content-length")
    if raw is None or not raw.isdigit() or len(raw) > 12:
        raise BadRequest(411 if raw is None else 400)
    return Head(webhook=webhook, length=int(raw),
                encoding=found.get(b"content-encoding", b"").decode("latin-1"),
                keep_alive=_keep_alive(version, found), expects_continue=found.get(b"expect") == b"100-continue")


def parse_get(head: bytes, paths: frozenset[str]) -> Head:
    """Read a probe's request head: a GET of one of `paths` (without their slash), with no body (a probe
    has none to send, and a body here would only be bytes to hold); raises BadRequest as `parse_head`."""
    method, target, version, found = _read(head)
    path = target.partition(b"?")[0].decode("latin-1")
    if path[:1] != "/" or path[1:] not in paths:
        raise BadRequest(404)
    if method != b"GET":
        raise BadRequest(405)
    if b"transfer-encoding" in found or found.get(b"content-length", b"0") != b"0":
        raise BadRequest(400)
    return Head(webhook=path[1:], length=0, encoding="", keep_alive=_keep_alive(version, found),
                expects_continue=False)


def _read(head: bytes) -> tuple[bytes, bytes, bytes, dict[bytes, bytes]]:
    """The request line's method, target and version, and the headers a server reads; raises BadRequest."""
    line_end = head.find(b"\r\n")
    request_line = head if line_end < 0 else head[:line_end]
    parts = request_line.split(b" ")
    if len(parts) != 3 or _CTL.search(request_line):
        raise BadRequest(400)
    method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest(505 if version.startswith(b"HTTP/") else 400)
    if line_end >= 0:
        if head.count(b"\r\n") > MAX_HEADERS:
            raise BadRequest(431)
        if not _HEADER_LINES.fullmatch(head + b"\r\n", line_end + 2):  # the head ends without its last CRLF
            raise BadRequest(400)
    found: dict[bytes, bytes] = {}
    for name, value in _WANTED.findall(head.lower()):
        if name in found and name in (b"content-length", b"transfer-encoding"):
            raise BadRequest(400)  # two lengths: a smuggling attempt, never a real client
        found[name] = value
    return method, target, version, found


def _keep_alive(version: bytes, found: dict[bytes, bytes]) -> bool:
    connection = found.get(b"connection", b"")
    return b"close" not in connection if version == b"HTTP/1.1" else b"keep-alive" in connection


#: The headers the server reads, found in one pass over the lower-cased head; values without blanks around.
_WANTED = re.compile(rb"\r\n(content-length|transfer-encoding|connection|content-encoding|expect):[ \t]*"
                     rb"([^\r]*?)[ \t]*(?=\r\n|$)")


#: Header lines: a token, a colon, then visible characters, spaces and tabs (no control characters).
_HEADER_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*")


def _route(target: bytes) -> str:
    """The webhook a target names (/<id> or /warn/<id>, any query string ignored); 404 for anything else."""
    path = target.partition(b"?")[0].decode("latin-1")
    if "%" in path:
        path = unquote(path, encoding="latin-1")
    match = _ROUTE.fullmatch(path)
    if match is None:
        raise BadRequest(404)
    return match.group(1)


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def answer(status: int, body: bytes, *, close: bool, content_type: bytes = b"application/json") -> bytes:
    """A whole response: status line, headers and body, in one buffer (one TLS write)."""
    return b"".join((
        _STATUS.get(status) or _status_line(status),
        b"Server: " + SERVER_NAME.encode() + b"\r\nContent-Type: ", content_type,
        b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\nDate: ", _date(),
        b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n", body))


def error_answer(status: int, allow: bytes = b"POST") -> bytes:
    """The fixed answer to a request that cannot be served: status and phrase only, and the connection
    closes; a 405 names the one method the port takes."""
    phrase = _phrase(status)
    extra = b"Allow: " + allow + b"\r\n" if status == 405 else b""
    body = f"{status} {phrase}\n".encode()
    return b"".join((_status_line(status), b"Server: ", SERVER_NAME.encode(), b"\r\n", extra,
                     b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: ", str(len(body)).encode(),
                     b"\r\nDate: ", _date(), b"\r\nConnection: close\r\n\r\n", body))


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {_phrase(status)}\r\n".encode()


_STATUS = {s: _status_line(s) for s in (200, 400, 404, 415, 500)}
_DATE: list[object] = [0, b""]  # [the second, its IMF-fixdate]: formatted once a second, not per answer


def _date() -> bytes:
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[0], _DATE[1] = now, formatdate(now, usegmt=True).encode()
    date = _DATE[1]
    assert isinstance(date, bytes)
    return date
