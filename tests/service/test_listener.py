"""The listener's limits and its graceful drain, against the real TLS server on asyncio's loop, as `serve` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import ssl
from collections.abc import Callable
from typing import cast

import pytest

from devtools.load import attacks
from devtools.waiting import until_async
from hami_mt_webhook.service.serving import listener as listener_module
from hami_mt_webhook.service.serving.connections import Limits
from hami_mt_webhook.service.serving.http11 import MAX_HEAD, MAX_REQUEST_LINE
from tests.builders import container, make_pod, padded_request, review_body


def cut_off(listener: listener_module.Listener) -> int:
    """Connections closed for missing a deadline (a handshake, a request, an answer not read)."""
    return sum(n for reason, n in listener.closed.items() if reason.startswith("deadline"))


def client_context(ca_path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_path))


async def connect(running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", running.port, ssl=client_context(running.ca_path))


def request_bytes(body: bytes, extra: str = "") -> bytes:
    return (f"POST /mutate-pods HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def good_body() -> bytes:
    return json.dumps(review_body(make_pod(container(limits={"mthreads.com/vgpu": 1})))).encode()


async def roundtrip(running) -> bytes:
    reader, writer = await connect(running)
    writer.write(request_bytes(good_body(), "Connection: close\r\n"))
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


async def test_a_client_sending_headers_a_byte_at_a_time_is_cut_off(serve_webhook):
    async with serve_webhook(limits=Limits(request_timeout=0.5)) as running:
        reader, writer = await connect(running)
        head = request_bytes(good_body())
        closed_after = None
        loop = asyncio.get_running_loop()
        started = loop.time()
        for byte in head[:40]:
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except (ConnectionError, ssl.SSLError):
                closed_after = loop.time() - started
                break
            if reader.at_eof() or await _closed(reader):
                closed_after = loop.time() - started
                break
        assert closed_after is not None and closed_after < 2.0
        assert cut_off(running.server.listener) == 1
        assert b"200 OK" in await roundtrip(running)  # and it keeps serving


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), 0.1)
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True
    return data == b""


async def test_a_body_that_does_not_arrive_in_time_is_cut_off(serve_webhook):
    async with serve_webhook(limits=Limits(request_timeout=0.3)) as running:
        reader, writer = await connect(running)
        body = good_body()
        writer.write(request_bytes(body)[: -len(body) + 10])  # headers and 10 bytes of the body
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 3) == b""
        assert cut_off(running.server.listener) == 1
        writer.close()
        assert b"200 OK" in await roundtrip(running)


async def test_a_kept_alive_connection_is_not_cut_off_between_requests(serve_webhook):
    async with serve_webhook(limits=Limits(request_timeout=0.3)) as running:
        reader, writer = await connect(running)
        for _ in range(3):
            writer.write(request_bytes(good_body()))
            status, headers = await read_head(reader)
            assert status.startswith(b"HTTP/1.1 200")
            await reader.readexactly(int(headers[b"content-length"]))
            await asyncio.sleep(0.5)  # idle longer than request_timeout: keep-alive, not a slow request
        assert cut_off(running.server.listener) == 0
        writer.close()


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
    status = await asyncio.wait_for(reader.readline(), 3)
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def kept_alive(running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose one request is answered and that is kept alive, as kube-apiserver pools them."""
    reader, writer = await connect(running)
    writer.write(request_bytes(good_body()))
    assert (await attacks.read_answer(reader))[0] == 200
    return reader, writer


async def raw_connect(running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that never starts TLS."""
    return await asyncio.open_connection("127.0.0.1", running.port)


async def eventually(check: Callable[[], object], timeout: float = 5.0) -> None:
    """`check()` true within `timeout`: `until_async`, since the server runs on this test's own loop."""
    async def probe() -> bool:
        return bool(check())
    await until_async("the condition", probe, timeout, 0.02)


async def test_unfinished_handshakes_count_and_a_new_caller_is_still_served(serve_webhook):
    async with serve_webhook(limits=Limits(max_connections=4)) as running:
        listener = running.server.listener
        silent = [await raw_connect(running) for _ in range(2)]
        half = [await raw_connect(running) for _ in range(2)]
        for _, w in half:
            w.write(attacks.client_hello()[:40])  # half a ClientHello: the handshake starts, never ends
        await eventually(lambda: listener.phases()["handshake"] == 2 and listener.phases()["silent"] == 2)
        assert listener.connections == 4
        assert b"200 OK" in await roundtrip(running)  # room is made: the oldest silent connection goes
        assert listener.closed["shed-silent"] == 1 and listener.closed["shed-handshake"] == 0
        assert await asyncio.wait_for(silent[0][0].read(), 3) == b""
        silent[1][1].close()
        more = await raw_connect(running)  # at the cap again, with handshakes only
        more[1].write(attacks.client_hello()[:40])
        await eventually(lambda: listener.phases()["handshake"] == 3 and listener.connections == 3)
        last = await raw_connect(running)
        last[1].write(attacks.client_hello()[:40])
        await eventually(lambda: listener.connections == 4)
        assert b"200 OK" in await roundtrip(running)
        assert listener.closed["shed-handshake"] == 1
        assert await asyncio.wait_for(half[0][0].read(), 3) == b""  # the oldest handshake went
        assert listener.closed["refused"] == 0
        for _, w in [*half, more, last]:
            w.close()


async def test_at_the_cap_kept_alive_connections_make_room_last(serve_webhook):
    async with serve_webhook(limits=Limits(max_connections=2)) as running:
        listener = running.server.listener
        kept, kept_w = await kept_alive(running)  # idle
        unused, _ = await connect(running)  # TLS done, no request sent
        await eventually(lambda: listener.phases() == {**listener.phases(), "idle": 1, "new": 1})
        assert b"200 OK" in await roundtrip(running)
        assert listener.closed["shed-new"] == 1
        assert await asyncio.wait_for(unused.read(), 3) == b""  # the connection that never asked went
        kept_w.write(request_bytes(good_body(), "Connection: close\r\n"))  # the kept-alive one still works
        assert (await asyncio.wait_for(kept.read(), 3)).startswith(b"HTTP/1.1 200 OK")
        _, kept_w2 = await connect(running)
        idle, idle_w = await connect(running)
        idle_w.write(request_bytes(good_body()))
        await read_head(idle)
        assert b"200 OK" in await roundtrip(running)
        assert listener.closed["shed-new"] == 2  # the connection that never asked, again
        other, other_w = await connect(running)
        other_w.write(request_bytes(good_body()))
        await read_head(other)
        await eventually(lambda: listener.phases()["idle"] == 2)
        assert b"200 OK" in await roundtrip(running)  # no other choice: a kept-alive one goes, the oldest
        assert listener.closed["shed-idle"] == 1
        assert b"HTTP/1.1" not in await asyncio.wait_for(idle.read(), 3)
        kept_w2.close()
        other_w.close()


async def test_idle_connections_are_closed_at_the_idle_deadline(serve_webhook):
    async with serve_webhook(limits=Limits(idle_timeout=0.4)) as running:
        loop = asyncio.get_running_loop()
        quiet, _ = await connect(running)  # never sends a request
        kept, kept_w = await connect(running)
        kept_w.write(request_bytes(good_body()))
        await read_head(kept)
        started = loop.time()
        assert await asyncio.wait_for(quiet.read(), 5) == b""
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError, ssl.SSLError)):
            while True:  # the rest of the answer, then the close
                if not await asyncio.wait_for(kept.read(65536), 5):
                    raise ConnectionResetError
        assert loop.time() - started < 3
        await eventually(lambda: running.server.listener.connections == 0)
        assert running.server.listener.closed["deadline-new"] == 1
        assert running.server.listener.closed["deadline-idle"] == 1


async def test_a_kept_alive_connection_whose_next_request_waits_unread_is_served_not_closed(serve_webhook):
    # On a busy loop the idle deadline can be checked after kube-apiserver has sent its next request on a
    # pooled connection but before the loop has read it; closing then loses a POST it does not retry.
    async with serve_webhook(limits=Limits(idle_timeout=5.0)) as running:
        listener = running.server.listener
        kept, kept_w = await kept_alive(running)
        await eventually(lambda: listener.phases()["idle"] == 1)
        kept_w.write(request_bytes(good_body()))  # in the server's socket at once (loopback), not yet read
        listener.close_expired(asyncio.get_running_loop().time() + 5.5)  # past the deadline, before the read
        assert (await asyncio.wait_for(attacks.read_answer(kept), 5))[0] == 200
        assert listener.closed["deadline-idle"] == 0
        # Without a request waiting, the same check closes it.
        await eventually(lambda: listener.phases()["idle"] == 1)
        listener.close_expired(asyncio.get_running_loop().time() + 5.5)
        assert listener.closed["deadline-idle"] == 1
        kept_w.close()


async def test_making_room_spares_a_long_kept_alive_connection_that_has_begun_a_request(serve_webhook):
    # kube-apiserver's pooled connections are the oldest a replica has; when one starts its next request
    # while a flood fills the listener, a newer connection that has sent nothing goes, not that one.
    async with serve_webhook(limits=Limits(max_connections=3)) as running:
        listener = running.server.listener
        kept, kept_w = await kept_alive(running)
        others = [await connect(running) for _ in range(2)]  # handshaken, never a request
        await eventually(lambda: listener.phases()["new"] == 2)
        whole = request_bytes(good_body())
        kept_w.write(whole[:40])  # the next request, begun
        await eventually(lambda: listener.phases()["reading"] == 1)
        _, newcomer = await raw_connect(running)  # the listener is full: someone makes room
        await eventually(lambda: listener.closed["shed-new"] == 1)
        kept_w.write(whole[40:])
        assert (await asyncio.wait_for(attacks.read_answer(kept), 5))[0] == 200
        assert listener.closed["shed-reading"] == 0
        for _, w in others:
            w.close()
        newcomer.close()
        kept_w.close()


async def test_a_handshake_that_never_finishes_is_cut_at_its_deadline(serve_webhook):
    async with serve_webhook(limits=Limits(handshake_timeout=0.3)) as running:
        reader, writer = await raw_connect(running)
        writer.write(attacks.client_hello()[:40])
        _, silent = await raw_connect(running)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await eventually(lambda: running.server.listener.connections == 0)
        assert running.server.listener.closed["deadline-handshake"] == 1
        assert running.server.listener.closed["deadline-silent"] == 1
        silent.close()


async def test_a_client_that_does_not_read_its_answers_is_cut_at_the_write_deadline(serve_webhook):
    async with serve_webhook(limits=Limits(write_timeout=0.5)) as running:
        listener = running.server.listener
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small, so the answers back up
        sock.connect(("127.0.0.1", running.port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, ssl=client_context(running.ca_path),
                                                       server_hostname="127.0.0.1")
        cast(asyncio.Transport, writer.transport).pause_reading()  # never reads: pipelined answers fill every buffer
        one = request_bytes(good_body())
        for _ in range(400):  # more answers than the kernel's buffers hold
            writer.write(one * 50)
            await asyncio.sleep(0)
        await eventually(lambda: listener.closed["deadline-writing"] == 1, 10)
        await eventually(lambda: listener.connections == 0)
        writer.transport.abort()
        assert b"200 OK" in await roundtrip(running)


async def test_bad_requests_get_a_fixed_answer_and_no_version_banner(serve_webhook):
    async with serve_webhook() as running:
        reader, writer = await connect(running)
        writer.write(b"GET /mutate-pods HTTP/1.1\r\nHost: x\r\nX-Bad\x01Header-SECRET-TOKEN: 1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 3)
        assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        assert b"SECRET-TOKEN" not in answer
        head = answer.split(b"\r\n\r\n")[0].lower()
        assert b"server: hami-mt-webhook\r\n" in head + b"\r\n" and b"aiohttp" not in head and b"python" not in head


async def test_a_compressed_body_gets_415_and_is_counted(serve_webhook):
    async with serve_webhook() as running:
        reader, writer = await connect(running)
        writer.write(request_bytes(good_body(), "Content-Encoding: gzip\r\n"))
        answer = await asyncio.wait_for(reader.read(), 3)
        assert answer.startswith(b"HTTP/1.1 415")
        assert b"gzip" in answer and b"Traceback" not in answer
        assert running.state.metrics.bad_requests.labels("mutate-pods")._value.get() == 1


async def test_large_bodies_are_answered_through_the_decoding_lane(serve_webhook):
    async with serve_webhook(limits=Limits(big_body=1024, big_concurrency=1)) as running:
        answers = await asyncio.gather(*(roundtrip(running) for _ in range(4)), roundtrip_body(running, b"{nope"))
        for answer in answers[:4]:
            assert answer.startswith(b"HTTP/1.1 200 OK")
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["response"]["patchType"] == "JSONPatch"
        assert answers[4].startswith(b"HTTP/1.1 400") and b"not JSON" in answers[4]


async def roundtrip_body(running, body: bytes) -> bytes:
    reader, writer = await connect(running)
    writer.write(request_bytes(body, "Connection: close\r\n"))
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


async def test_no_session_tickets_are_issued(serve_webhook):
    async with serve_webhook() as running:
        reader, writer = await connect(running)
        writer.write(request_bytes(good_body(), "Connection: close\r\n"))
        await asyncio.wait_for(reader.read(), 3)
        session = writer.get_extra_info("ssl_object").session
        assert session is None or not session.has_ticket


async def test_stopping_finishes_in_flight_reviews_and_closes_kept_alive_connections(serve_webhook):
    async with serve_webhook(limits=Limits(drain_seconds=2.0, shutdown_timeout=2.0)) as running:
        listener = running.server.listener
        reader, writer = await connect(running)
        body = good_body()
        whole = request_bytes(body)
        writer.write(whole[:-5])  # a review in flight: its last bytes are still on the way
        await writer.drain()
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(listener.stop())
        await asyncio.sleep(0.2)
        assert listener.draining
        try:  # no new connections while draining
            r2, w2 = await connect(running)
            assert await asyncio.wait_for(r2.read(), 3) == b""
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        writer.write(whole[-5:])
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert b"Connection: close" in answer  # the client will not reuse a closing connection
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["response"]["allowed"] is True
        await asyncio.wait_for(stopping, 5)


async def test_handshakes_under_way_are_bounded_and_the_oldest_gives_way(serve_webhook):
    async with serve_webhook(limits=Limits(max_handshakes=2)) as running:
        listener = running.server.listener
        half = []
        for _ in range(3):
            half.append(await raw_connect(running))
            half[-1][1].write(attacks.client_hello()[:40])
            await asyncio.sleep(0.05)
        await eventually(lambda: listener.closed["shed-handshake"] == 1)
        assert listener.phases()["handshake"] == 2
        assert await asyncio.wait_for(half[0][0].read(), 3) == b""  # the oldest
        assert b"200 OK" in await roundtrip(running)  # a real client's handshake is the newest
        for _, w in half:
            w.close()


async def test_thousands_of_pipelined_requests_on_one_connection_are_all_answered(serve_webhook):
    """Each buffered request is taken on the loop's next turn: a deep pipeline never recurses."""
    async with serve_webhook() as running:
        reader, writer = await connect(running)
        count = 3000
        writer.write(request_bytes(good_body()) * count)
        await writer.drain()
        data = b""
        while data.count(b"HTTP/1.1 200 OK") < count:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 30)
            assert chunk, f"closed after {data.count(b'HTTP/1.1 200 OK')} answers"
            data += chunk
        assert data.count(b"HTTP/1.1 ") == count
        writer.close()
        assert cut_off(running.server.listener) == 0


def counted_trims(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The listener's heap trims, counted (one entry each) instead of done; each one "trimmed"."""
    trims: list[int] = []

    def trim_heap() -> bool:
        trims.append(1)
        return True

    monkeypatch.setattr(listener_module, "trim_heap", trim_heap)
    return trims


async def test_the_heap_is_given_back_once_a_burst_of_connections_is_gone(serve_webhook, monkeypatch):
    """A handshake flood leaves its TLS state's memory in glibc's arenas; the listener trims after it."""
    monkeypatch.setattr(listener_module, "TRIM_AFTER", 20)
    trims = counted_trims(monkeypatch)
    async with serve_webhook() as running:
        listener = running.server.listener
        burst = [await raw_connect(running) for _ in range(24)]
        await eventually(lambda: listener.connections == 24)
        await asyncio.sleep(0.6)  # a sweep or two with the burst still open: nothing to give back yet
        assert trims == []
        for _, writer in burst:
            writer.close()
        await eventually(lambda: trims == [1])
        await asyncio.sleep(0.6)
        assert trims == [1]  # once per burst, not on every sweep


#: How the bytes of a request are written: whole (one write), in writes of 1,000 bytes, or cut inside the
#: head's blank line. Each write is its own TLS record, so the server reads each on its own.
SPLITS = {
    "whole": lambda data: [],
    "1000-byte writes": lambda data: list(range(1000, len(data), 1000)),
    "cut in the blank line": lambda data: [data.index(b"\r\n\r\n") + 1, data.index(b"\r\n\r\n") + 3],
}


async def answers_to(running, data: bytes, split: str) -> list[int]:
    """The statuses the server answers `data` with, written as `split` says, until it closes."""
    reader, writer = await connect(running)
    cuts = [0, *SPLITS[split](data), len(data)]
    with contextlib.suppress(ConnectionError):  # a refused client may still be writing when the server closes
        for start, end in itertools.pairwise(cuts):
            writer.write(data[start:end])
            await writer.drain()
    statuses = []
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        while True:  # a hang is a failure: wait_for raises
            statuses.append((await asyncio.wait_for(attacks.read_answer(reader), 5))[0])
    writer.close()
    return statuses


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(("data", "expected"), [
    pytest.param(padded_request(64, MAX_HEAD, good_body()), [200], id="head-at-the-limit"),
    pytest.param(padded_request(64, MAX_HEAD + 1, good_body()), [431], id="head-one-byte-over"),
    pytest.param(padded_request(64, 20_000, good_body()), [431], id="20KB-head"),
    pytest.param(padded_request(MAX_REQUEST_LINE, 9000, good_body()), [200], id="request-line-at-the-limit"),
    pytest.param(padded_request(MAX_REQUEST_LINE + 1, 9000, good_body()), [414], id="request-line-one-byte-over"),
    pytest.param(padded_request(20_000, 20_100, good_body()), [414], id="20KB-request-line"),
    pytest.param(request_bytes(good_body()) + padded_request(64, 20_000, good_body()), [200, 431],
                 id="pipelined-20KB-head"),
    pytest.param(request_bytes(good_body()) + padded_request(20_000, 20_100, good_body()), [200, 414],
                 id="pipelined-20KB-request-line"),
    pytest.param(b"POST /mutate-pods HTTP/1.1\r\nContent-Length: 4000000\r\n\r\n" + b"{" * 3000, [413],
                 id="body-over-the-limit"),
    pytest.param(request_bytes(good_body(), "Connection: close\r\n" + "X: y\r\n" * 96), [200],
                 id="100-header-lines"),
    pytest.param(request_bytes(good_body(), "Connection: close\r\n" + "X: y\r\n" * 97), [431],
                 id="101-header-lines"),
    pytest.param(b"POST /mutate-pods HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", [411],
                 id="chunked"),
])
async def test_the_listeners_limits_hold_however_the_bytes_arrive(serve_webhook, data, expected, split):
    """Each limit that meets the bytes as they are read (the request line, the head, its lines, the body's
    length, a request pipelined behind another) answers the same whether the bytes come whole or cut."""
    async with serve_webhook() as running:
        assert await answers_to(running, data, split) == expected
        assert b"200 OK" in await roundtrip(running)  # and it keeps serving


async def test_the_heap_is_given_back_once_large_bodies_stop_coming(serve_webhook, monkeypatch):
    """Large reviews leave their bytes and parsed objects in the allocators' arenas; the listener trims
    `TRIM_QUIET` after the last one, once, and not while they keep coming."""
    monkeypatch.setattr(listener_module, "TRIM_QUIET", 0.8)
    trims = counted_trims(monkeypatch)
    async with serve_webhook(limits=Limits(big_body=1024)) as running:
        loop = asyncio.get_running_loop()
        until = loop.time() + 2.0
        while loop.time() < until:  # a large review every 0.2 s: never quiet for long enough
            assert (await roundtrip_body(running, attacks.review(0.01))).startswith(b"HTTP/1.1 200 OK")
            await asyncio.sleep(0.2)
        assert trims == []
        await eventually(lambda: trims == [1])
        await asyncio.sleep(1.2)
        assert trims == [1]  # once after they stop, not on every sweep
        assert b"200 OK" in await roundtrip(running)  # a small review is no large body
        await asyncio.sleep(1.2)
        assert trims == [1]
