"""One replica at a time: a Lease (coordination.k8s.io), as client-go's leader election holds one."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from .client import Api


def now() -> str:
    """The time now as the API server writes a MicroTime."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Lease:
    """Held while renewed every third of its duration, taken over by another replica once it has seen the
    Lease unchanged for a whole duration (its own clock: no trust in the holder's)."""

    def __init__(self, me: str, namespace: str, name: str, seconds: float) -> None:
        self.me, self.seconds = me, seconds
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.name, self.namespace = name, namespace
        self.holding = False
        self._seen: tuple[str, float] = ("", 0.0)  # the resourceVersion last seen, and when it was first seen

    async def hold(self, api: Api) -> bool:
        """Take or renew the Lease; whether this replica holds it now."""
        # not asked again on a 429: the next renewal comes a third of the duration later, and a holder
        # waiting on the server's word could be taken over meanwhile
        status, lease = await api.call("GET", self.path, ok=(200, 404), retries=0)
        spec = self._spec()
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
            status, _ = await api.call("POST", self.path.rpartition("/")[0], body, ok=(201, 409), retries=0)
            self.holding = status == 201
            return self.holding
        meta, current = _mapping(lease.get("metadata")), _mapping(lease.get("spec"))
        version = str(meta.get("resourceVersion") or "")
        if version != self._seen[0]:
            self._seen = (version, time.monotonic())
        holder = current.get("holderIdentity")
        duration = float(current.get("leaseDurationSeconds") or self.seconds)
        if holder not in (self.me, None, "") and time.monotonic() - self._seen[1] < duration:
            self.holding = False
            return False
        if holder != self.me:
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        else:
            spec["acquireTime"] = current.get("acquireTime") or spec["acquireTime"]
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0)
        body = {**lease, "spec": spec}
        status, _ = await api.call("PUT", self.path, body, ok=(200, 409), retries=0)
        self.holding = status == 200
        return self.holding

    def _spec(self) -> dict[str, Any]:
        """This replica as the holder, renewed now (and acquired now, unless it held it already)."""
        stamp = now()
        return {"holderIdentity": self.me, "leaseDurationSeconds": int(self.seconds), "acquireTime": stamp,
                "renewTime": stamp}

    async def release(self, api: Api) -> None:
        """Let another replica take over at once (a clean shutdown), rather than after the duration."""
        if not self.holding:
            return
        self.holding = False
        status, lease = await api.call("GET", self.path, ok=(200, 404))
        if status == 200 and _mapping(lease.get("spec")).get("holderIdentity") == self.me:
            await api.call("PUT", self.path, {**lease, "spec": {**lease["spec"], "holderIdentity": None}},
                           ok=(200, 409))
