"""The gray faults' kernel parts without a cluster: the loss rules drop the share asked, silently, on a veth
between two network namespaces made here; the redirect and the relay hold a pod's answers, not its requests."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.clusters.nodes import DELAY_PORT_OFFSET, delay_rules, loss_rules
from devtools.load import delayer
from devtools.scenarios.faults import FAULTS, GRAY, GRAY_AFTER, EndpointWatch, gray

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"),
                                reason="needs root, nft and ip (network namespaces of its own)")


@pytest.mark.parametrize("percent", [-1, 101])
def test_a_loss_out_of_range_is_refused_naming_it(percent: int) -> None:
    with pytest.raises(ValueError, match=f"a loss of {percent} %"):
        loss_rules("veth0", percent)


@pytest.fixture
def link() -> Iterator[tuple[str, str]]:
    """Two network namespaces, `node` and `pod`, joined by a veth (vnode in node, eth0 in pod), 10.99.0.1-2."""
    node, pod = f"hmw-gray-node-{os.getpid()}", f"hmw-gray-pod-{os.getpid()}"
    setup = [["ip", "netns", "add", node], ["ip", "netns", "add", pod],
             ["ip", "-n", node, "link", "add", "vnode", "type", "veth", "peer", "name", "eth0", "netns", pod],
             ["ip", "-n", node, "addr", "add", "10.99.0.1/24", "dev", "vnode"],
             ["ip", "-n", pod, "addr", "add", "10.99.0.2/24", "dev", "eth0"],
             *(["ip", "-n", ns, "link", "set", dev, "up"] for ns, dev in ((node, "vnode"), (pod, "eth0"),
                                                                           (node, "lo"), (pod, "lo")))]
    try:
        for cmd in setup:
            subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        yield node, pod
    finally:
        for ns in (node, pod):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _datagrams_through(node: str, pod: str, n: int = 2000) -> int:
    """How many of `n` UDP datagrams from the pod reach the node; the sender must see no error."""
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", node, sys.executable, "-c",
         "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('10.99.0.1', 9999))\n"
         "s.settimeout(1.0)\nn = 0\nprint('ready', flush=True)\ntry:\n    while True:\n        s.recv(64)\n"
         "        n += 1\nexcept TimeoutError:\n    print(n)\n"], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
    subprocess.run(["ip", "netns", "exec", pod, sys.executable, "-c",
                    f"import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    f"for i in range({n}):\n    s.sendto(b'x', ('10.99.0.1', 9999))\n"
                    "    if i % 50 == 0:\n        time.sleep(0.002)\n"], check=True, timeout=60)
    out, _ = receiver.communicate(timeout=30)
    return int(out.split()[-1])


@needs_root
def test_the_loss_rules_drop_the_share_asked_silently_and_replace_each_other(link: tuple[str, str]) -> None:
    node, pod = link
    nft = ["ip", "netns", "exec", node, "nft"]
    subprocess.run([*nft, loss_rules("vnode", 30)], check=True, timeout=30)
    through = _datagrams_through(node, pod)
    assert 1200 <= through <= 1600, through  # 70 % of 2,000 is 1,400; 6 standard deviations is about 120
    subprocess.run([*nft, loss_rules("vnode", 100)], check=True, timeout=30)  # a flap's down half
    assert _datagrams_through(node, pod, 200) == 0
    subprocess.run([*nft, loss_rules("vnode", 0)], check=True, timeout=30)  # and its up half
    assert _datagrams_through(node, pod, 200) == 200


async def _echo_server() -> tuple[asyncio.Server, list[float]]:
    """A server answering each line with itself; when each line arrived."""
    arrived: list[float] = []

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            arrived.append(time.monotonic())
            writer.write(line)
            await writer.drain()
        writer.close()
    return await asyncio.start_server(client, "127.0.0.1", 0), arrived


async def test_the_relay_holds_answers_not_requests() -> None:
    server, arrived = await _echo_server()
    port = server.sockets[0].getsockname()[1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = probe.getsockname()[1]
    relays = await delayer.serve([(listen, port)], 0.3, host="127.0.0.1")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listen)
        for _ in range(2):
            sent = time.monotonic()
            writer.write(b"ping\n")
            assert await asyncio.wait_for(reader.readline(), 5) == b"ping\n"
            took = time.monotonic() - sent
            assert 0.3 <= took < 0.5, took
            assert arrived[-1] - sent < 0.1  # the request passed at once
        writer.close()
    finally:
        for s in (*relays, server):
            s.close()


@needs_root
def test_the_redirect_sends_only_what_comes_in_on_eth0_to_the_relay(link: tuple[str, str]) -> None:
    node, pod = link
    inside = ["ip", "netns", "exec", pod]
    server = subprocess.Popen([*inside, sys.executable, "-c",
                               "import socket\ns = socket.create_server(('0.0.0.0', 8080))\n"
                               "print('ready', flush=True)\n"
                               "while True:\n    c, _ = s.accept()\n    c.sendall(c.recv(64))\n    c.close()\n"],
                              stdout=subprocess.PIPE, text=True)
    relay = subprocess.Popen([*inside, sys.executable, "-m", "devtools.load.delayer", "--delay", "0.4",
                              f"{8080 + DELAY_PORT_OFFSET}:8080"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        for p in (server, relay):
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        subprocess.run([*inside, "nft", delay_rules([8080])], check=True, timeout=30)
        ask = ("import socket, time\nt = time.monotonic()\nc = socket.create_connection(('{}', 8080), 5)\n"
               "c.sendall(b'x')\nassert c.recv(64) == b'x'\nprint(time.monotonic() - t)\n")
        from_node = subprocess.run(["ip", "netns", "exec", node, sys.executable, "-c", ask.format("10.99.0.2")],
                                   capture_output=True, text=True, check=True, timeout=30).stdout
        from_pod = subprocess.run([*inside, sys.executable, "-c", ask.format("127.0.0.1")],
                                  capture_output=True, text=True, check=True, timeout=30).stdout
        assert 0.4 <= float(from_node) < 0.7, from_node
        assert float(from_pod) < 0.2, from_pod  # the relay's own way in: not redirected
    finally:
        for p in (server, relay):
            p.kill()
            p.wait()


def _watch(*changes: tuple[float, dict[str, bool]]) -> EndpointWatch:
    watch = EndpointWatch.__new__(EndpointWatch)
    watch.changes = list(changes)
    return watch


def test_the_endpoint_watch_counts_each_exit_of_the_victim_and_names_the_others_taken_out() -> None:
    # a victim that left, came back, left again; one other replica taken out after the fault, one before it
    watch = _watch((1.0, {"v": True, "a": True, "b": False}), (5.0, {"v": False, "a": True, "b": False}),
                   (6.0, {"v": True, "a": True, "b": True}), (7.0, {"v": False, "a": False, "b": True}),
                   (9.0, {"a": True, "b": True}))
    assert watch.exits("v", 2.0) == 2
    assert watch.exits("v", 6.5) == 1
    assert watch.left("v", 2.0) == 5.0
    assert watch.others_out("v", 2.0) == {"a"}  # b was already out before the fault: not the fault's doing
    calm = _watch((1.0, {"v": True, "a": True}), (5.0, {"v": False, "a": True}))
    assert calm.exits("v", 2.0) == 1 and calm.others_out("v", 2.0) == frozenset()


def test_a_gray_fault_of_any_length_is_named_for_it() -> None:
    assert {key: gray(key).name for key in GRAY}["loss30"] == "30 % packet loss 60 s"
    long = gray("flap", 180)
    assert long.name == "link flapping (down 1 s, up 2 s) 180 s" and long.seconds == 180 + GRAY_AFTER
    assert FAULTS["slow2500"].name == "answers 2.5 s late 60 s"
