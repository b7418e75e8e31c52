"""The probe and metrics ports: /readyz, /livez, /metrics and /peers on a plain-HTTP listener with the
webhook port's limits: ready only when the node view is synced and the webhook port listens, and slow,
idle or silent clients by the thousand cut, shed and drained as on the webhook port."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import orjson
import pytest

from devtools.load import attacks
from devtools.procs import free_ports
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.service.failover.peers import Failover, Peers
from hami_mt_webhook.service.failover.peerview import Replica, Verdict, View
from hami_mt_webhook.service.serving import probes
from hami_mt_webhook.service.serving.connections import Limits
from hami_mt_webhook.service.serving.listener import Listener
from hami_mt_webhook.service.state import State
from tests.builders import nodes_view
from tests.service.test_listener import cut_off, eventually

FAST = Limits(drain_seconds=0.3, shutdown_timeout=0.3)


@contextlib.asynccontextmanager
async def serve_probes(state: State, limits: Limits = FAST, peers: Callable[[], bytes] | None = None
                       ) -> AsyncIterator[Listener]:
    """The probe port as `serve` runs it, on a port the kernel picks."""
    listeners = await probes.listen(state, probes.routes(state, peers), "127.0.0.1", [0], limits)
    try:
        yield listeners[0]
    finally:
        await probes.stop(listeners)


async def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(attacks.read_answer(reader), 5)
    finally:
        writer.close()


async def readyz(port: int) -> tuple[int, str]:
    status, _, body = await get(port, "/readyz")
    return status, body.decode()


async def test_ready_needs_the_view_and_the_listener(serve_webhook) -> None:
    state = State(Config(), ClusterView(ready=False))
    async with serve_probes(state) as probe:
        assert await readyz(probe.port) == (503, "not ready: the node view is not synced yet\n")
        state.view.replace({node.name: node for node in nodes_view()})
        state.view.ready = True  # as the node feed sets it once the set is complete
        # The view is synced before kopf has started the webhook server: still not ready.
        assert await readyz(probe.port) == (503, "not ready: the webhook port is not listening\n")
        async with serve_webhook(state) as running:
            assert await readyz(probe.port) == (200, "ready: 2 sliced nodes\n")
            async with aiohttp.ClientSession() as plain:  # the port really answers by now
                try:
                    await plain.get(f"http://127.0.0.1:{running.port}/")
                except aiohttp.ClientError:
                    pass  # TLS expected; the connection was accepted, which is all this checks
        # Stopped (drained): out of the Service's endpoints again.
        await asyncio.sleep(0)
        assert await readyz(probe.port) == (503, "not ready: the webhook port is not listening\n")


async def test_livez_does_not_depend_on_readiness() -> None:
    async with serve_probes(State(Config(), ClusterView(ready=False))) as probe:
        status, headers, body = await get(probe.port, "/livez")
        assert (status, body, headers["content-type"]) == (200, b"ok\n", "text/plain; charset=utf-8")


async def test_metrics_are_prometheus_text_and_count_the_probe_ports_connections() -> None:
    state = State(Config(), ClusterView(ready=False))
    async with serve_probes(state, Limits(request_timeout=0.2)) as probe:
        _, writer = await asyncio.open_connection("127.0.0.1", probe.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")  # and nothing more: cut at the request deadline
        await eventually(lambda: cut_off(probe) == 1)
        writer.close()
        status, headers, body = await get(probe.port, "/metrics?x=1")
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b'hami_mt_webhook_probe_connections_closed_total{reason="deadline-reading"} 1.0' in body
    assert b"\nhami_mt_webhook_probe_connections 1.0\n" in body  # the scrape's own connection


async def test_peers_answers_this_replicas_view() -> None:
    state = State(Config(), ClusterView(ready=False))
    peers = Peers(state, lambda: None, Failover(me="webhook-a", namespace="ns", selector="app=x"), port=0,
                  mode="list")
    async with serve_probes(state, peers=peers.answer) as probe:
        status, headers, body = await get(probe.port, "/peers")
    assert (status, headers["content-type"]) == (200, "application/json")
    assert orjson.loads(body) == {"name": "webhook-a", "heard": {}, "silent": [], "failing": {}}


def peers_writing_to(written: list[Verdict], monkeypatch: pytest.MonkeyPatch, port: int = 0) -> Peers:
    """Replica "a"'s failover, synced with peers "a", "b", "c" all answering, whose verdicts land in `written`
    instead of the API server."""
    peers = Peers(State(Config(), ClusterView(ready=False)), lambda: None,
                  Failover(me="a", namespace="ns", selector="app=x"), port=port, mode="list")
    peers.feed.replicas = {n: Replica(n, "127.0.0.1", ready=True, answering=True) for n in "abc"}
    peers.feed.synced_at = time.time()

    async def write(verdict: Verdict, target: Replica) -> None:
        written.append(verdict)

    monkeypatch.setattr(peers, "_write", write)
    return peers


async def test_a_refused_probe_is_judged_at_once_not_at_the_loops_next_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer whose port refuses connections (a crash): the failed probe itself writes the verdict, since every
    call kube-apiserver sends there until the endpoint goes is a refused pod."""
    [closed] = free_ports(1)  # nothing listens there
    written: list[Verdict] = []
    peers = peers_writing_to(written, monkeypatch, port=closed)
    peers._heard["c"] = time.monotonic()
    peers._http = aiohttp.ClientSession()
    try:
        await peers._probe("c", "127.0.0.1")
        await asyncio.sleep(0)  # the write's task runs
    finally:
        await peers._http.close()
    assert [(v.name, v.answering, v.reason) for v in written] == [("c", False, "refuses connections: nothing listens")]


async def test_a_verdict_undone_by_kubelet_is_written_again_once_its_gate_was_seen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Written just now and the watch still shows the gate True: not written twice. The watch shows the gate
    False but Ready True again (kubelet's reconcile wrote its cached Ready back): written again at once."""
    written: list[Verdict] = []
    peers = peers_writing_to(written, monkeypatch)
    peers._heard.update(b=time.monotonic(), c=time.monotonic())
    peers._refused.add("c")
    peers._written["c"] = (False, time.monotonic())
    peers._decide()
    await asyncio.sleep(0)
    assert written == []
    peers.feed.replicas["c"] = Replica("c", "127.0.0.1", ready=True, answering=False)
    peers._decide()
    await asyncio.sleep(0)
    assert [(v.name, v.answering) for v in written] == [("c", False)]


async def test_a_replica_just_marked_is_put_back_only_after_answering_since_the_mark(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another replica's probe met a crash first and marked it; this one's last probes still answered (a run of
    8 s): no verdict putting it back until it has answered for `recover_after` since the mark was seen."""
    written: list[Verdict] = []
    peers = peers_writing_to(written, monkeypatch)
    peers.feed.replicas["c"] = Replica("c", "127.0.0.1", ready=False, answering=False)
    now = time.monotonic()
    peers._heard.update(b=now, c=now)
    peers._streak.update(b=now - 8, c=now - 8)
    peers._views["b"] = View("b", {"a": 0.05, "c": 0.05})
    peers._decide()
    await asyncio.sleep(0)
    assert written == []
    peers._out_since["c"] -= 1.5  # seen marked 1.5 s ago, answering all along
    peers._decide()
    await asyncio.sleep(0)
    assert [(v.name, v.answering) for v in written] == [("c", True)]


async def test_other_methods_and_paths_get_fixed_answers_without_a_banner() -> None:
    async with serve_probes(State(Config(), ClusterView(ready=False))) as probe:
        answers = {}
        for request in (b"POST /readyz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"GET /peers HTTP/1.1\r\n\r\n",
                        b"GET /readyz/x HTTP/1.1\r\n\r\n", b"GET /livez HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
                        b"GET /livez HTTP/2.0\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", probe.port)
            writer.write(request)
            status, headers, body = await asyncio.wait_for(attacks.read_answer(reader), 5)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # and the connection closes
            writer.close()
            answers[request.split(b"\r\n")[0]] = (status, headers.get("allow"), body)
            assert headers["server"] == "hami-mt-webhook"
    assert answers == {b"POST /readyz HTTP/1.1": (405, "GET", b"405 Method Not Allowed\n"),
                       b"GET /peers HTTP/1.1": (404, None, b"404 Not Found\n"),  # no failover: no /peers
                       b"GET /readyz/x HTTP/1.1": (404, None, b"404 Not Found\n"),
                       b"GET /livez HTTP/1.1": (400, None, b"400 Bad Request\n"),
                       b"GET /livez HTTP/2.0": (505, None, b"505 HTTP Version Not Supported\n")}


async def test_pipelined_gets_on_one_kept_alive_connection_are_answered_in_order() -> None:
    async with serve_probes(State(Config(), ClusterView(ready=False))) as probe:
        reader, writer = await asyncio.open_connection("127.0.0.1", probe.port)
        writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await asyncio.wait_for(attacks.read_answer(reader), 5)
        second = await asyncio.wait_for(attacks.read_answer(reader), 5)
        assert (first[0], first[2], second[0]) == (200, b"ok\n", 503)
        assert "connection" not in second[1]  # kept alive: a third request is answered too
        writer.write(b"GET /livez HTTP/1.1\r\nConnection: close\r\n\r\n")
        third = await asyncio.wait_for(attacks.read_answer(reader), 5)
        assert third[1]["connection"] == "close" and await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_a_client_sending_a_header_byte_at_a_time_is_cut_at_the_request_deadline() -> None:
    async with serve_probes(State(Config(), ClusterView(ready=False)), Limits(request_timeout=0.5)) as probe:
        reader, writer = await asyncio.open_connection("127.0.0.1", probe.port)
        loop = asyncio.get_running_loop()
        writer.write(b"GET /readyz HTTP/1.1\r\n")
        started = loop.time()
        closed_after = None
        for byte in b"X-Slow: " + b"a" * 40:  # a byte every 0.1 s: never a whole head within 0.5 s
            try:
                writer.write(bytes([byte]))
                await writer.drain()
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    closed_after = loop.time() - started
                    break
            except TimeoutError:
                continue
            except ConnectionError:
                closed_after = loop.time() - started
                break
        writer.close()
        assert closed_after is not None and 0.4 < closed_after < 2.0
        assert probe.closed["deadline-reading"] == 1
        assert (await readyz(probe.port))[0] == 503  # and it keeps answering


async def test_thousands_of_silent_connections_are_shed_oldest_first_and_readyz_answers(nodes_view) -> None:
    state = State(Config(), nodes_view)
    state.serving = True
    limits = Limits(max_connections=100, handshake_timeout=60, drain_seconds=0.2, shutdown_timeout=0.2)
    async with serve_probes(state, limits) as probe:
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(3000):
                held.append(await asyncio.open_connection("127.0.0.1", probe.port))
            await eventually(lambda: probe.connections == 100 and probe.closed["shed-silent"] >= 2900)
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await readyz(probe.port) == (200, "ready: 2 sliced nodes\n")
            assert loop.time() - started < 1.0
            # The oldest were closed to make room; the newest are still held.
            assert await asyncio.wait_for(held[0][0].read(), 5) == b""
            assert not await closed_soon(held[-1][0])
        finally:
            for _, writer in held:
                writer.transport.abort()


async def test_a_flood_from_one_address_makes_room_among_its_own_connections(nodes_view) -> None:
    state = State(Config(), nodes_view)
    state.serving = True
    limits = Limits(max_connections=50, handshake_timeout=60, drain_seconds=0.2, shutdown_timeout=0.2)
    async with serve_probes(state, limits) as probe:
        # Others' connections: one whose request has not arrived yet, one kept alive after a GET.
        waiting = await asyncio.open_connection("127.0.0.1", probe.port)
        kept = await asyncio.open_connection("127.0.0.1", probe.port)
        kept[1].write(b"GET /livez HTTP/1.1\r\n\r\n")
        assert (await asyncio.wait_for(attacks.read_answer(kept[0]), 5))[0] == 200
        flood = []
        try:
            for _ in range(500):  # one pod reconnecting as fast as it is shed
                flood.append(await asyncio.open_connection("127.0.0.1", probe.port, local_addr=("127.0.0.2", 0)))
            await eventually(lambda: probe.closed["shed-silent"] >= 450)
            assert await readyz(probe.port) == (200, "ready: 2 sliced nodes\n")  # a newcomer sheds the flood's
            for reader, writer in (waiting, kept):  # and the flood never closed the others' connections
                writer.write(b"GET /readyz HTTP/1.1\r\n\r\n")
                assert (await asyncio.wait_for(attacks.read_answer(reader), 5))[0] == 200
            assert probe.connections <= 50
        finally:
            for _, writer in (*flood, waiting, kept):
                writer.transport.abort()


async def test_stopping_answers_a_kept_alive_connection_with_close_and_refuses_new_ones() -> None:
    state = State(Config(), ClusterView(ready=False))
    listeners = await probes.listen(state, probes.routes(state), "127.0.0.1", [0],
                                    Limits(drain_seconds=2.0, shutdown_timeout=0.3))
    probe = listeners[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", probe.port)
    writer.write(b"GET /livez HTTP/1.1\r\n\r\n")
    assert (await asyncio.wait_for(attacks.read_answer(reader), 5))[0] == 200
    stopping = asyncio.create_task(probes.stop(listeners))
    await eventually(lambda: probe.draining)
    writer.write(b"GET /livez HTTP/1.1\r\n\r\n")  # on the open connection: answered, with its close
    status, headers, _ = await asyncio.wait_for(attacks.read_answer(reader), 5)
    assert (status, headers["connection"]) == (200, "close")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    await asyncio.wait_for(stopping, 5)
    assert probe.connections == 0
    try:
        await asyncio.open_connection("127.0.0.1", probe.port)
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError("the port still accepts")
    writer.close()


async def closed_soon(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 0.3) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True

