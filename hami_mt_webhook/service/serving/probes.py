"""The probe and metrics endpoints, on plain-HTTP listeners with the webhook port's limits (`listener`).

A bare HTTP server held every connection a client opened for as long as it trickled bytes (19,000 from
one pod took a replica from 38 to 170 MiB); these ports take GETs of a few fixed paths, and every
connection is counted, timed and shed as on the webhook port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from ..state import State
from .connections import Limits
from .http11 import Answer, Head, parse_get
from .listener import Listener

__all__ = ["listen", "routes", "stop"]

TEXT = b"text/plain; charset=utf-8"
PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"

#: What a path answers: called on the event loop for each GET of it.
Page = Callable[[], Answer]


def readyz(state: State) -> Answer:
    """Ready once the node view has been synced (and stays so while the watch reconnects: see `nodewatch`)
    and the webhook port listens; kopf starts the server after the view may already be synced, and a
    draining server must leave the Service's endpoints."""
    if not state.view.ready:
        return Answer(503, b"not ready: the node view is not synced yet\n", content_type=TEXT)
    if not state.serving:
        return Answer(503, b"not ready: the webhook port is not listening\n", content_type=TEXT)
    return Answer(200, f"ready: {len(state.view)} sliced nodes\n".encode(), content_type=TEXT)


def livez() -> Answer:
    """Only says the event loop answers."""
    return Answer(200, b"ok\n", content_type=TEXT)


def metrics(state: State) -> Answer:
    return Answer(200, state.metrics.render(), content_type=PROMETHEUS)


def routes(state: State, peers: Callable[[], bytes] | None = None) -> dict[str, Page]:
    """The paths the probe and metrics ports answer (without their slash); /peers with failover, whose
    `peers` gives this replica's view as JSON."""
    table: dict[str, Page] = {"readyz": lambda: readyz(state), "livez": livez,
                               "metrics": lambda: metrics(state)}
    if peers is not None:
        view = peers
        table["peers"] = lambda: Answer(200, view())
    return table


class ProbeResponder:
    """Answers GETs of `routes`; anything else gets the listener's fixed answers (404, 405, 400)."""

    allow = b"GET"

    def __init__(self, table: Mapping[str, Page]) -> None:
        self.table = dict(table)
        self.paths = frozenset(table)
        self.big_lane = asyncio.Semaphore(1)  # never taken: a GET here has no body

    def parse(self, head: bytes) -> Head:
        return parse_get(head, self.paths)

    def answer(self, head: Head, body: bytes) -> Answer:
        return self.table[head.webhook]()

    async def answer_big(self, head: Head, body: bytes) -> Answer:
        return self.answer(head, body)

    def refused(self, head: Head, status: int) -> None:
        """Nothing to count: a probe's refusals show in the connections closed."""


async def listen(state: State, table: Mapping[str, Page], host: str, ports: Iterable[int],
                 limits: Limits) -> list[Listener]:
    """One plain-HTTP listener per distinct port, sharing `table`, listening once this returns; their
    connections are counted apart from the webhook port's."""
    responder = ProbeResponder(table)
    metrics = state.metrics
    listeners = [Listener(responder, host or "0.0.0.0", port, None, limits,
                          on_close=metrics.probe_connection_closed) for port in dict.fromkeys(ports)]
    metrics.probe_connections.set_function(lambda: sum(listener.connections for listener in listeners))
    started: list[Listener] = []
    try:
        for listener in listeners:
            await listener.start()
            started.append(listener)
    except BaseException:
        await stop(started)
        raise
    return listeners


async def stop(listeners: Iterable[Listener]) -> None:
    """Drain and close them together (each bounded by its limits)."""
    await asyncio.gather(*(listener.stop() for listener in listeners))
