"""The listener's limits and its graceful drain, against the real TLS server."""

from __future__ import annotations

import asyncio
import json
import ssl

from helpers import container, make_pod, review_body

from hami_mt_webhook.listener import Limits


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
        assert running.server.listener.cut_off == 1
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
        assert running.server.listener.cut_off == 1
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
        assert running.server.listener.cut_off == 0
        writer.close()


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
    status = await asyncio.wait_for(reader.readline(), 3)
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def test_connections_over_the_cap_are_closed_on_arrival(serve_webhook):
    async with serve_webhook(limits=Limits(max_connections=3)) as running:
        held = [await connect(running) for _ in range(3)]
        reader, writer = await connect(running)
        assert await asyncio.wait_for(reader.read(), 3) == b""
        assert running.server.listener.refused == 1
        for _, w in held:
            w.close()
        await asyncio.sleep(0.2)
        assert b"200 OK" in await roundtrip(running)


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
