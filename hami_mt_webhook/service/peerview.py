"""The pure part of failover: who the replicas are, who has gone silent, and what most of them agree on.

kube-apiserver never retries a webhook call and never health-checks an endpoint, so a replica that is
still a ready endpoint but cannot answer (hung, cut off, on a node that died) refuses every call it is
given until kubelet or the node controller notices: seconds for a hung process, 40 to 50 s for a dead
node. The replicas watch each other instead (`peers` does the I/O): each asks every other one for its
view a few times a second, and a replica that most of them have not heard from for `silent_after`
seconds is marked not answering through the chart's readiness gate, which takes it out of the Service's
endpoints within about a second.

The judgement is here, a function of plain values: a replica cut off from the others hears nobody, but
it cannot get most of the replicas to agree, so it never marks the healthy ones; the last ready replica
is never marked; a marked replica that most of them hear again for `recover_after` seconds is marked
answering again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONDITION", "Replica", "Timing", "Verdict", "View", "disputed", "judge", "replica"]

#: The readiness gate's condition type, set on a replica's pod status by the replicas themselves.
CONDITION = "hami-mt.mthreads.com/answering"


@dataclass(frozen=True)
class Replica:
    """What the watch keeps of one of the Deployment's pods."""

    name: str
    ip: str
    #: The pod's Ready condition: what the EndpointSlice controller reads.
    ready: bool
    #: The readiness gate's condition: True, False, or None while nobody has set it.
    answering: bool | None
    deleting: bool = False


def replica(pod: Mapping[str, Any]) -> Replica | None:
    """A pod as the judgement sees it; None for one with no address yet (no call can reach it)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ip = status.get("podIP") or ""
    name = meta.get("name") or ""
    if not ip or not name:
        return None
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or () if isinstance(c, dict)}
    gate = conditions.get(CONDITION)
    return Replica(name=name, ip=ip, ready=conditions.get("Ready") == "True",
                   answering=None if gate is None else gate == "True",
                   deleting=bool(meta.get("deletionTimestamp")))


@dataclass(frozen=True)
class View:
    """One replica's view of the others, as it answers them at /peers: when it last heard each one."""

    name: str
    #: Seconds since this replica last heard each peer; a peer it has never heard is absent.
    heard: Mapping[str, float] = field(default_factory=dict)
    #: The peers it has not heard from for `silent_after` seconds.
    silent: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "heard": {k: round(v, 3) for k, v in self.heard.items()},
                "silent": sorted(self.silent)}

    @classmethod
    def from_json(cls, data: Any) -> View:
        """A peer's answer; anything malformed reads as a view that vouches for nobody."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("not a peer view")
        heard, silent = data.get("heard"), data.get("silent")
        heard = heard if isinstance(heard, dict) else {}
        silent = silent if isinstance(silent, list) else []
        return cls(name=data["name"],
                   heard={str(k): float(v) for k, v in heard.items() if isinstance(v, int | float)},
                   silent=frozenset(str(s) for s in silent))


@dataclass(frozen=True)
class Timing:
    """How long silence or an answer must last before a verdict."""

    silent_after: float = 0.75
    recover_after: float = 1.0


@dataclass(frozen=True)
class Verdict:
    """A change of one replica's readiness gate: `answering` False takes it out of the endpoints."""

    name: str
    answering: bool
    #: How many replicas agreed, of how many there are: for the log line and the metrics.
    agreed: int
    of: int
    reason: str


def judge(me: str, replicas: Mapping[str, Replica], heard: Mapping[str, float],
          answering_since: Mapping[str, float], views: Mapping[str, View], timing: Timing,
          refused: Collection[str] = ()) -> list[Verdict]:
    """The verdicts this replica should write now.

    `heard` is the seconds since this replica last heard each peer it probes (or since it began to probe
    one it has not heard yet); `answering_since` the seconds each has answered without a gap; `views` the
    latest view of each peer that answered (a silent peer's view is dropped, so it does not count).
    `refused` are the peers whose last probe was refused: their host's kernel answered that nothing listens
    (a crash, an OOM kill), which a replica cut off could never be told, so one replica's word is enough.
    """
    members = {name: r for name, r in replicas.items() if not r.deleting}
    verdicts: list[Verdict] = []
    own = members.get(me)
    if own is not None and own.answering is False and not _serving(members, but=me):
        # Never leave the Service empty because of a verdict: the last replica vouches for itself.
        verdicts.append(Verdict(me, True, 1, len(members), "no other replica is ready"))
    for name, r in members.items():
        silent_for = heard.get(name)
        if name == me or silent_for is None:
            continue
        if r.answering is True and name in refused and _serving(members, but=name):
            verdicts.append(Verdict(name, False, 1, len(members), "refuses connections: nothing listens"))
        elif r.answering is True and silent_for >= timing.silent_after:
            agreed = _agreeing(me, name, members, views, silent=True)
            if 2 * agreed > len(members) and _serving(members, but=name):
                verdicts.append(Verdict(name, False, agreed, len(members), f"not heard for {silent_for:.1f} s"))
        elif r.answering is False and silent_for < timing.silent_after \
                and answering_since.get(name, 0.0) >= timing.recover_after:
            agreed = _agreeing(me, name, members, views, silent=False)
            if 2 * agreed > len(members):
                verdicts.append(Verdict(name, True, agreed, len(members),
                                        f"answering for {answering_since[name]:.1f} s"))
    return verdicts


def disputed(me: str, replicas: Mapping[str, Replica], heard: Mapping[str, float],
             views: Mapping[str, View], timing: Timing) -> list[str]:
    """The peers this replica has not heard for `silent_after` that most replicas still hear: a split
    view (this replica cut off from some, or a partial partition) that no verdict will settle."""
    members = {name: r for name, r in replicas.items() if not r.deleting}
    return sorted(name for name in members if name != me and heard.get(name, 0.0) >= timing.silent_after
                  and 2 * _agreeing(me, name, members, views, silent=True) <= len(members))


def _agreeing(me: str, name: str, members: Mapping[str, Replica], views: Mapping[str, View], *,
              silent: bool) -> int:
    """This replica and the others (not `name`) whose view has `name` silent, or else heard and not silent."""
    return 1 + sum(1 for peer, view in views.items() if peer not in (me, name) and peer in members
                   and (name in view.silent if silent else name in view.heard and name not in view.silent))


def _serving(members: Mapping[str, Replica], *, but: str) -> bool:
    """Whether a replica other than `but` is a ready endpoint."""
    return any(r.ready and r.answering is not False for r in members.values() if r.name != but)
