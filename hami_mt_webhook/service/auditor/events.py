"""The audit's Warning Events: what one says, and how few are sent."""

from __future__ import annotations

from collections.abc import Iterable

from ...audit.findings import FAIL, WARN, Result
from ...audit.objects import Obj, Subject
from ...rules.text import clip
from ..kube.lease import now

#: Events a pass sends at most, whatever the findings: the API server is never flooded by the audit.
EVENTS_PER_PASS = 20
EVENT_REASONS = {FAIL: "PodsDenied", WARN: "PodsWouldBeDenied"}


class EventLimit:
    """At most one Event per workload and finding every `every` seconds, and `per_pass` a pass."""

    def __init__(self, every: float, per_pass: int = EVENTS_PER_PASS) -> None:
        self.every, self.per_pass = every, per_pass
        self._sent: dict[tuple[str, str, str], float] = {}

    def due(self, results: Iterable[Result], now: float) -> list[Result]:
        """The results to send an Event for now, marked as sent."""
        self._sent = {k: t for k, t in self._sent.items() if now - t < self.every}
        out: list[Result] = []
        for r in results:
            key = (r.subject.uid or r.subject.label(), r.rule, r.message)
            if key in self._sent or len(out) >= self.per_pass:
                continue
            self._sent[key] = now
            out.append(r)
        return out


def event(result: Result, me: str) -> Obj:
    """A Warning Event on the workload, where `kubectl describe` and event exporters look."""
    s: Subject = result.subject
    stamp = now()
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{s.name}.", "namespace": s.namespace},
            "involvedObject": s.reference(), "type": "Warning", "reason": EVENT_REASONS[result.result],
            "message": clip(f"hami-mt-webhook audit: {result.message}", 1000),
            "source": {"component": "hami-mt-webhook"}, "reportingComponent": "hami-mt-webhook",
            "reportingInstance": me, "firstTimestamp": stamp[:19] + "Z", "lastTimestamp": stamp[:19] + "Z",
            "count": 1}
