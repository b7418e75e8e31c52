"""The request head as the webhook port reads it, and the fixed answers for what it does not serve."""

from __future__ import annotations

import pytest

from hami_mt_webhook.service.serving.http11 import (
    MAX_HEAD,
    MAX_REQUEST_LINE,
    BadRequest,
    Head,
    answer,
    error_answer,
    head_end,
    parse_head,
)
from tests.builders import padded_request

GO_CLIENT = (b"POST /mutate-pods?timeout=3s HTTP/1.1\r\nHost: hami-mt-webhook.hami-mt-webhook.svc:443\r\n"
             b"User-Agent: kube-apiserver-admission\r\nContent-Length: 2712\r\nAccept: application/json, */*\r\n"
             b"Content-Type: application/json\r\nAccept-Encoding: gzip")


def test_kube_apiservers_request_head():
    assert parse_head(GO_CLIENT) == Head("mutate-pods", 2712, "", keep_alive=True, expects_continue=False)


@pytest.mark.parametrize(("head", "expected"), [
    (b"POST /warn/validate-pods HTTP/1.0\r\nContent-Length: 0\r\nConnection: Keep-Alive",
     Head("warn/validate-pods", 0, "", keep_alive=True, expects_continue=False)),
    (b"POST /mutate-pods HTTP/1.0\r\nContent-Length: 5", Head("mutate-pods", 5, "", False, False)),
    (b"POST /mutate-pods HTTP/1.1\r\ncontent-length:   7  \r\nCONNECTION: close",
     Head("mutate-pods", 7, "", False, False)),
    (b"POST /mutate%2Dpods HTTP/1.1\r\nContent-Length: 1\r\nContent-Encoding: GZIP\r\nExpect: 100-continue",
     Head("mutate-pods", 1, "gzip", True, True)),
])
def test_what_is_read_of_a_head(head, expected):
    assert parse_head(head) == expected


@pytest.mark.parametrize(("head", "status"), [
    (b"GET /mutate-pods HTTP/1.1\r\nHost: x", 405),
    (b"POST / HTTP/1.1\r\nContent-Length: 1", 404),
    (b"POST /a/b HTTP/1.1\r\nContent-Length: 1", 404),
    (b"POST /x HTTP/1.1\r\nX-Bad\x01Header: 1", 400),  # a control character in a name
    (b"POST /x HTTP/1.1\r\nX-Value: a\x00b\r\nContent-Length: 1", 400),
    (b"POST /x HTTP/1.1\r\nA : b\r\nContent-Length: 1", 400),  # blank before the colon
    (b"POST /x HTTP/1.1\r\nno colon\r\nContent-Length: 1", 400),
    (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2", 400),  # two lengths: request smuggling
    (b"POST /x HTTP/1.1\r\nContent-Length: -1", 400),
    (b"POST /x HTTP/1.1\r\nContent-Length: 1e3", 400),
    (b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999", 400),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked", 411),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4", 411),
    (b"POST /x HTTP/1.1\r\nHost: x", 411),
    (b"POST /x HTTP/2.0\r\nContent-Length: 1", 505),
    (b"POST /x FTP/1.1\r\nContent-Length: 1", 400),
    (b"POST  /x HTTP/1.1\r\nContent-Length: 1", 400),
    (b"\x16\x03\x01\x02\x00", 400),  # a TLS ClientHello sent to a plain reader
    (b"POST /x HTTP/1.1" + b"\r\nX: y" * 101, 431),
])
def test_what_is_refused_and_how(head, status):
    with pytest.raises(BadRequest) as refused:
        parse_head(head)
    assert refused.value.status == status


def test_answers_carry_length_server_and_close_only_when_asked():
    kept = answer(200, b'{"a":1}', close=False)
    head, body = kept.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == b'{"a":1}'
    assert b"\r\nContent-Length: 7" in head and b"\r\nServer: hami-mt-webhook" in head and b"Connection" not in head
    assert b"\r\nConnection: close" in answer(200, b"", close=True)


def outcome(buf: bytes) -> int | str:
    try:
        return head_end(buf)
    except BadRequest as bad:
        return f"HTTP {bad.status}"


@pytest.mark.parametrize(("line", "head", "expected"), [
    (64, 300, 300),
    (64, MAX_HEAD, MAX_HEAD),
    (64, MAX_HEAD + 1, "HTTP 431"),
    (64, 20_000, "HTTP 431"),
    (MAX_REQUEST_LINE, MAX_REQUEST_LINE + 100, MAX_REQUEST_LINE + 100),
    (MAX_REQUEST_LINE + 1, MAX_REQUEST_LINE + 100, "HTTP 414"),
    (20_000, 20_040, "HTTP 414"),  # over both limits: the request line is told
])
def test_the_head_limits_hold_wherever_the_bytes_are_cut(line, head, expected):
    """The connection asks after every read; each prefix of the bytes must give "not yet" or the answer the
    whole gives, so no split into reads changes it (every prefix near a limit or a line end, a sample of
    the rest)."""
    data = padded_request(line, head)
    assert outcome(data) == expected
    marks = [MAX_REQUEST_LINE, MAX_HEAD, line, head, len(data)]
    cuts = {n for mark in marks for n in range(mark - 6, mark + 7)} | set(range(0, len(data), 61))
    seen = {outcome(data[:n]) for n in cuts if 0 <= n <= len(data)}
    assert seen <= {-1, expected}, f"a prefix answered otherwise: {seen}"


@pytest.mark.parametrize("status", [400, 404, 405, 411, 413, 414, 431, 505])
def test_error_answers_are_fixed_text_and_close(status):
    out = error_answer(status)
    head, body = out.split(b"\r\n\r\n", 1)
    assert head.startswith(f"HTTP/1.1 {status} ".encode()) and b"\r\nConnection: close" in head
    assert body.startswith(str(status).encode()) and (b"Allow: POST" in head) == (status == 405)
