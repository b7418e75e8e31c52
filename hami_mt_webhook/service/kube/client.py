"""The one way this replica reaches kube-apiserver: its login, a client session, and client-go's retry rule.

Every caller goes through `Api`: the node and quota watches and the peer watch (`watch.Watch`), failover's
status writes, the audit's reads and writes, and the Lease (`lease.Lease`). A caller that should not wait on
the server's word (a Lease renewal, a verdict on a replica) asks with `retries=0`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import kopf
import orjson

Login = Callable[[], kopf.ConnectionInfo | None]

#: client-go's rule for an answer that says when to come back (a Retry-After header on 429 or 500-504, as
#: kube-apiserver gives while a resource's watch cache re-initialises or its fairness queues are full): wait
#: that long and ask again, up to this many times, so a call is not lost to a second of the server's.
RETRIES = 10
#: The longest Retry-After honoured, in seconds: a caller does not sleep on a server's word for minutes.
RETRY_AFTER_MAX = 10.0


class ApiError(Exception):
    """The API server refused or broke a call; `status` is its HTTP status or Status code, if any, and
    `retry_after` the seconds it asked the caller to wait (client-go's rule), if it did."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class Expired(ApiError):
    """The resourceVersion to resume from is gone (410): the set must be built anew."""


def retry_after(status: int, header: str | None) -> float | None:
    """Seconds to wait before asking again, or None when the answer is final (client-go's `checkWait`)."""
    if header is None or not (status == 429 or 500 <= status <= 504):
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None  # an HTTP date: kube-apiserver never sends one
    return min(max(seconds, 0.0), RETRY_AFTER_MAX)


def resource(path: str) -> str:
    """`pods`, `policyreports`, `leases`: the resource a path names, for a request counter."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        return rest[2]
    return rest[0] if rest else "other"


def _uncounted(verb: str, resource: str) -> None:
    pass


class Api:
    """kube-apiserver at `server`, reached through `session`; each request `count`ed by verb and resource."""

    def __init__(self, session: aiohttp.ClientSession, server: str,
                 count: Callable[[str, str], None] = _uncounted) -> None:
        self.session, self.server, self.count = session, server, count

    @classmethod
    def open(cls, info: kopf.ConnectionInfo, *, connections: int = 2,
             count: Callable[[str, str], None] = _uncounted) -> Api:
        """A session of its own as `info` logs in, at most `connections` at once; `close` it, or use
        `async with`."""
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context(), limit=connections),
            headers={**info.as_http_headers(), "Accept": "application/json", "Accept-Encoding": "identity",
                     "User-Agent": "hami-mt-webhook"},
            trust_env=info.trust_env)
        return cls(session, info.server, count)

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def request(self, verb: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None,
                      ok: Iterable[int] = (200, 201), retries: int = RETRIES, timeout: float = 60.0,
                      content_type: str = "application/json") -> tuple[int, bytes]:
        """One call, asked again while the server says when to (`RETRIES`); its status and body, unparsed.
        An answer outside `ok` raises `ApiError` (`Expired` for 410)."""
        accepted = frozenset(ok)
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else None
        for attempt in range(retries + 1):
            self.count(verb, resource(path))
            async with self.session.request(verb, self.server + path, data=data, params=params, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.read()
            wait = retry_after(resp.status, resp.headers.get("Retry-After"))
            if wait is None or resp.status in accepted or attempt == retries:
                break
            await asyncio.sleep(wait)
        if resp.status not in accepted:
            raise _error(resp.status, f"{verb} {path}", raw, wait)
        return resp.status, raw

    async def call(self, verb: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None,
                   ok: Iterable[int] = (200, 201), retries: int = RETRIES, timeout: float = 60.0,
                   content_type: str = "application/json") -> tuple[int, Any]:
        """`request`, with the body parsed (None when empty)."""
        status, raw = await self.request(verb, path, body, params=params, ok=ok, retries=retries,
                                         timeout=timeout, content_type=content_type)
        return status, orjson.loads(raw) if raw else None

    async def pages(self, path: str, limit: int, **params: str) -> AsyncIterator[list[dict[str, Any]]]:
        """The items of a paged list, a page at a time."""
        query = {"limit": str(limit), **params}
        while True:
            _, page = await self.call("GET", path, params=query)
            yield [item for item in page.get("items") or () if isinstance(item, dict)]
            meta = page.get("metadata")
            token = meta.get("continue") if isinstance(meta, dict) else None
            if not token:
                return
            query["continue"] = token

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Mapping[str, str],
                     read_timeout: float) -> AsyncIterator[aiohttp.StreamReader]:
        """A watch's response body as it arrives; an answer other than 200 raises `ApiError`, with the wait
        the server asked for when it gave one (the watch then reconnects after it)."""
        self.count("WATCH", resource(path))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
        async with self.session.get(self.server + path, params=params, timeout=timeout) as resp:
            if resp.status != 200:
                raw = await resp.read()
                raise _error(resp.status, f"GET {path}", raw,
                             retry_after(resp.status, resp.headers.get("Retry-After")))
            yield resp.content


def _error(status: int, call: str, raw: bytes, wait: float | None) -> ApiError:
    cls = Expired if status == 410 else ApiError
    return cls(f"HTTP {status} from {call}: {raw[:300].decode(errors='replace')}", status, wait)


def login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo | None:
    """A kubeconfig when one is given (local runs), else the pod's service account; read afresh each
    time, so a rotated service-account token is picked up on the next reconnect.

    In a pod the API server is the address kubelet puts in the environment, as client-go's in-cluster
    config takes it, not kopf's `kubernetes.default.svc`: a name that needs the cluster's DNS, so a DNS
    outage (or a node without it) would leave every replica unready and every slice pod refused."""
    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is not None:
        return info
    info = kopf.login_with_service_account(settings=settings)
    server = in_cluster_server(os.environ)
    return dataclasses.replace(info, server=server) if info is not None and server else info


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """The API server's URL from `KUBERNETES_SERVICE_HOST` and `_PORT`, or None when either is unset."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
