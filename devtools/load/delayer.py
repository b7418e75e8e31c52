"""Added latency on a pod's answers, where the kernel has no `sch_netem`: a TCP relay that holds each chunk.

`tc qdisc ... netem delay` is the usual way, but a kernel built without `sch_netem` (and without `sch_fq`,
whose departure times a BPF program could set, or `nfnetlink_queue` for a userspace queue) has none of
them. What it has is nftables' NAT: `NodeCluster.delay_pod` redirects the connections that reach the pod's
`eth0` on the chosen ports to this relay, run inside the pod's network namespace, which connects to the same
port on 127.0.0.1 (not redirected: the rule matches `eth0` only) and passes what the pod sends back `delay`
seconds after it read it, in order, as netem on the pod's interface delays its egress. The handshake is
the relay's, so a new connection is not delayed; every answer is. Requests are passed at once.

    python -m devtools.load.delayer --delay 0.5 18443:8443 18080:8080    (listen:target pairs, on all addresses)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

__all__ = ["relay", "serve"]


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
    """Each chunk from `src` written to `dst` `delay` seconds after it was read; reading goes on meanwhile."""
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await held.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()

    sender = asyncio.create_task(send())
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            held.put_nowait((time.monotonic() + delay, data))
    held.put_nowait((time.monotonic() + delay, b""))
    with contextlib.suppress(OSError):
        await sender


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: int, delay: float) -> None:
    """One connection: to 127.0.0.1:`target` at once, its answers back `delay` seconds late."""
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_copy(reader, up_writer, 0.0), _copy(up_reader, writer, delay))
    finally:
        for w in (writer, up_writer):
            w.close()


async def serve(pairs: list[tuple[int, int]], delay: float, host: str = "0.0.0.0") -> list[asyncio.Server]:
    """A listener on each `listen` port relaying to its `target`."""
    servers = []
    for listen, target in pairs:
        async def client(r: asyncio.StreamReader, w: asyncio.StreamWriter, target: int = target) -> None:
            await relay(r, w, target, delay)
        servers.append(await asyncio.start_server(client, host, listen))
    return servers


def _pair(text: str) -> tuple[int, int]:
    listen, _, target = text.partition(":")
    if not (listen.isdigit() and target.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not LISTEN:TARGET (two port numbers)")
    return int(listen), int(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.load.delayer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, required=True, help="seconds each answer is held")
    parser.add_argument("pairs", type=_pair, nargs="+", metavar="LISTEN:TARGET")
    args = parser.parse_args(argv)
    if not 0 <= args.delay <= 60:
        parser.error(f"--delay {args.delay} must be from 0 to 60 seconds")

    async def run() -> None:
        await serve(args.pairs, args.delay)
        print("ready", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
