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

Silence misses a replica that is only partly broken (a lossy or flapping link, a saturated uplink): it
answers often enough never to be silent for long, while kube-apiserver keeps sending it a share of the calls
and every call that meets a lost packet waits out its timeout. So each replica also keeps, per peer, the
outcomes of its probes over the last `window` seconds (`Outcomes`): a probe that failed or answered later
than `late_after` is a failure, and a peer whose share of failures reaches `fail_share` is judged as a
silent one is (a majority, never the last ready replica). A replica behind the lossy link sees everyone as
lossy, so a voter's word against a peer counts only while it still probes some other peer cleanly. Once
marked, a peer is put back only when its share has fallen below `clean_share` over a whole window (and it
has answered without a gap for `recover_after`): a link that flaps every few seconds keeps it out rather
than in and out of the endpoints.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CONDITION", "MIN_PROBES", "Timing"]

#: The readiness gate's condition type, set on a replica's pod status by the replicas themselves.
CONDITION = "hami-mt.mthreads.com/answering"
#: Probes a window must hold before its share of failures says anything: with fewer, a few unlucky ones (4 of
#: 16) would read as a lossy link. At the default interval a healthy peer gives this many in about 2 s.
MIN_PROBES = 20


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
    #: The share of its probes of each peer that failed or ran late over the window; a peer with fewer than
    #: `MIN_PROBES` in it is absent.
    failing: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "heard": {k: round(v, 3) for k, v in self.heard.items()},
                "silent": sorted(self.silent), "failing": {k: round(v, 3) for k, v in self.failing.items()}}

    @classmethod
    def from_json(cls, data: Any) -> View:
        """A peer's answer; anything malformed reads as a view that vouches for nobody."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("not a peer view")
        heard, silent, failing = data.get("heard"), data.get("silent"), data.get("failing")
        heard = heard if isinstance(heard, dict) else {}
        silent = silent if isinstance(silent, list) else []
        failing = failing if isinstance(failing, dict) else {}  # absent from a replica of an older version
        return cls(name=data["name"],
                   heard={str(k): float(v) for k, v in heard.items() if isinstance(v, int | float)},
                   silent=frozenset(str(s) for s in silent),
                   failing={str(k): min(1.0, max(0.0, float(v))) for k, v in failing.items()
                            if isinstance(v, int | float)})


@dataclass(frozen=True)
class Timing:
    """How long silence or an answer must last before a verdict, and what share of failed probes over how
    long a window makes a peer lossy (the defaults are argued in docs/operating.md's failover section)."""

    silent_after: float = 0.75
    recover_after: float = 1.0
    #: Seconds of probe outcomes each peer's share of failures is taken over.
    window: float = 5.0
    #: The share of failed or late probes at which a peer is judged not answering ...
    fail_share: float = 0.25
    #: ... and the share it must fall below, over a whole window, to be put back.
    clean_share: float = 0.05
    #: Seconds after which an answer counts as a failure: one TCP retransmission (200 ms at the least) is late.
    late_after: float = 0.15


class Outcomes:
    """One peer's probe outcomes over the last `window` seconds: when each ended, and whether it failed (no
    answer within the probe's timeout, or one later than `late_after`). Times are the caller's clock."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._ended: deque[tuple[float, bool]] = deque()
        self._failed = 0

    def add(self, now: float, failed: bool) -> None:
        self._ended.append((now, failed))
        self._failed += failed
        self._trim(now)

    def share(self, now: float) -> float | None:
        """The share of failures in the window; None while it holds fewer than `MIN_PROBES`."""
        self._trim(now)
        return self._failed / len(self._ended) if len(self._ended) >= MIN_PROBES else None

    def _trim(self, now: float) -> None:
        while self._ended and self._ended[0][0] <= now - self.window:
            self._failed -= self._ended.popleft()[1]


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
          refused: Collection[str] = (), failing: Mapping[str, float] | None = None) -> list[Verdict]:
    """The verdicts this replica should write now.

    `heard` is the seconds since this replica last heard each peer it probes (or since it began to probe
    one it has not heard yet); `answering_since` the seconds each has answered without a gap; `views` the
    latest view of each peer that answered (a silent peer's view is dropped, so it does not count).
    `refused` are the peers whose last probe was refused: their host's kernel answered that nothing listens
    (a crash, an OOM kill), which a replica cut off could never be told, so one replica's word is enough.
    `failing` is this replica's share of failed probes of each peer (`Outcomes.share`, those known).
    """
    members = {name: r for name, r in replicas.items() if not r.deleting}
    mine = _own_view(me, heard, failing or {}, timing)
    verdicts: list[Verdict] = []
    own = members.get(me)
    if own is not None and own.answering is False and not _serving(members, but=me):
        # Never leave the Service empty because of a verdict: the last replica vouches for itself.
        verdicts.append(Verdict(me, True, 1, len(members), "no other replica is ready"))
    for name, r in members.items():
        silent_for = heard.get(name)
        if name == me or silent_for is None:
            continue
        # In the endpoints: its gate True, or False while Ready is True again. kubelet owns Ready and, at its
        # periodic reconcile, writes back the Ready of its own cache when the API server's differs, so a
        # verdict's Ready False can be undone before kubelet has seen the gate; the verdict is then written
        # again, as its first time.
        serving = r.answering is True or (r.answering is False and r.ready)
        if serving and name in refused and _serving(members, but=name):
            verdicts.append(Verdict(name, False, 1, len(members), "refuses connections: nothing listens"))
        elif serving and _against(mine, name, members, timing):
            agreed = _agreeing(mine, name, members, views, timing, against=True)
            if 2 * agreed > len(members) and _serving(members, but=name):
                reason = (f"not heard for {silent_for:.1f} s" if name in mine.silent else
                          f"lost {100 * mine.failing[name]:.0f} % of probes over {timing.window:g} s")
                verdicts.append(Verdict(name, False, agreed, len(members), reason))
        elif r.answering is False and answering_since.get(name, 0.0) >= timing.recover_after \
                and _for(mine, name, timing):
            agreed = _agreeing(mine, name, members, views, timing, against=False)
            if 2 * agreed > len(members):
                verdicts.append(Verdict(name, True, agreed, len(members),
                                        f"answering for {answering_since[name]:.1f} s"))
    return verdicts


def disputed(me: str, replicas: Mapping[str, Replica], heard: Mapping[str, float],
             views: Mapping[str, View], timing: Timing, failing: Mapping[str, float] | None = None) -> list[str]:
    """The peers this replica has not heard for `silent_after`, or loses `fail_share` of the probes of, that
    most replicas still hear: a split view (this replica cut off from some or behind a lossy link, or a
    partial partition) that no verdict will settle. Its own discount does not apply here: a replica that
    sees everyone as lossy is the one to say so."""
    members = {name: r for name, r in replicas.items() if not r.deleting}
    mine = _own_view(me, heard, failing or {}, timing)
    return sorted(name for name in members if name != me
                  and (name in mine.silent or mine.failing.get(name, 0.0) >= timing.fail_share)
                  and 2 * _agreeing(mine, name, members, views, timing, against=True) <= len(members))


def _own_view(me: str, heard: Mapping[str, float], failing: Mapping[str, float], timing: Timing) -> View:
    return View(me, heard, frozenset(n for n, s in heard.items() if s >= timing.silent_after), failing)


def _against(view: View, name: str, members: Mapping[str, Replica], timing: Timing) -> bool:
    """Whether `view` has `name` not answering: silent, or lossy while its prober still probes another
    replica cleanly (one behind a lossy link of its own sees every peer lossy, and is not counted)."""
    if name in view.silent:
        return True
    if view.failing.get(name, 0.0) < timing.fail_share:
        return False
    return any(view.failing.get(p, 1.0) < timing.fail_share for p in members if p not in (view.name, name)
               and p not in view.silent)


def _for(view: View, name: str, timing: Timing) -> bool:
    """Whether `view` has `name` answering: heard, not silent, and (where it knows) under `clean_share`."""
    return name in view.heard and name not in view.silent and view.failing.get(name, 0.0) < timing.clean_share


def _agreeing(mine: View, name: str, members: Mapping[str, Replica], views: Mapping[str, View], timing: Timing,
              *, against: bool) -> int:
    """This replica and the others (not `name`) whose view has `name` not answering, or else answering."""
    return 1 + sum(1 for peer, view in views.items() if peer not in (mine.name, name) and peer in members
                   and (_against(view, name, members, timing) if against else _for(view, name, timing)))


def _serving(members: Mapping[str, Replica], *, but: str) -> bool:
    """Whether a replica other than `but` is a ready endpoint."""
    return any(r.ready and r.answering is not False for r in members.values() if r.name != but)
