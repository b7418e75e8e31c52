"""Prometheus metrics, in a registry of the process's own (served on a separate port)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..rules.decision import Decision

__all__ = ["Metrics"]

OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
#: The states of hami_mt_webhook_peers.
PEER_STATES = ("answering", "silent", "disputed")


class Metrics:
    """Everything the webhook counts; one instance per process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, ...], Any] = {}
        r = self.registry
        self.answered = ReviewCounts()  # the series every review updates: counted without a lock each
        r.register(self.answered)
        self.bad_requests = Counter("hami_mt_webhook_bad_requests",
                                    "Bodies that were not answerable reviews.", ["webhook"], registry=r)
        self.nodes = Gauge("hami_mt_webhook_sliced_nodes", "Sliced nodes in the node view.", registry=r)
        self.last_node_event = Gauge("hami_mt_webhook_last_node_event_timestamp_seconds",
                                     "Unix time of the last node event applied to the index.", registry=r)
        self.ready = Gauge("hami_mt_webhook_ready", "1 once the complete node set has been read.", registry=r)
        self.cert_expiry = Gauge("hami_mt_webhook_certificate_expiry_timestamp_seconds",
                                 "Unix time at which the serving certificate expires.", registry=r)
        self.cert_reloads = Counter("hami_mt_webhook_certificate_reloads",
                                    "Serving certificates loaded after a change.", ["result"], registry=r)
        self.watch_up = Gauge("hami_mt_webhook_node_watch_up", "1 while the Node watch is connected.",
                              registry=r)
        self.view_age = Gauge("hami_mt_webhook_node_view_age_seconds",
                              "Seconds the node view may be behind the API server: 0 while the watch is up "
                              "and synced, else the time since it last was.", registry=r)
        self.node_work = Histogram("hami_mt_webhook_node_work_seconds",
                                   "Time the event loop spent on one batch of node events (watch lines or a "
                                   "list page) without yielding: "
                                   "the longest a review can wait behind the node view.", registry=r,
                                   buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25))
        self.relists = Counter("hami_mt_webhook_node_relists",
                               "Complete node sets built from the API server (the first sync included).",
                               registry=r)
        self.connections = Gauge("hami_mt_webhook_connections",
                                 "Open connections on the webhook port, TLS handshakes included.", registry=r)
        self.connections_closed = Counter("hami_mt_webhook_connections_closed",
                                          "Connections the listener closed: refused, shed to make room for a "
                                          "new one, or past a deadline; by reason and phase.", ["reason"],
                                          registry=r)
        self.probe_connections = Gauge("hami_mt_webhook_probe_connections",
                                       "Open connections on the probe and metrics ports.", registry=r)
        self.probe_connections_closed = Counter("hami_mt_webhook_probe_connections_closed",
                                                "Connections the probe and metrics ports' listeners closed, as "
                                                "hami_mt_webhook_connections_closed counts the webhook port's.",
                                                ["reason"], registry=r)
        self.nonstandard = Gauge("hami_mt_webhook_nonstandard_capacity_nodes",
                                 "Sliced nodes whose per-card sgpu-memory is not a known card size (96, 160 "
                                 "or a memoryPerCard value): overcommitted memory, usually.", registry=r)

        self.peers = Gauge("hami_mt_webhook_peers",
                           "The other replicas as this one hears them (failover): answering, silent (not heard "
                           "for --peer-silent-after), and disputed (silent to this replica but heard by most "
                           "of the others: a split view no verdict settles).", ["state"], registry=r)
        self.peer_verdicts = Counter("hami_mt_webhook_peer_verdicts",
                                     "Verdicts this replica wrote on a replica's readiness gate: not_answering "
                                     "takes it out of the Service's endpoints, answering puts it back.",
                                     ["verdict"], registry=r)
        self.peer_failure_ratio = Gauge("hami_mt_webhook_peer_failure_ratio",
                                        "Share of this replica's probes of each other replica that failed or "
                                        "ran late (--peer-late-after) over --peer-window; NaN until the window "
                                        "holds enough probes.", ["peer"], registry=r)
        self.audit_violations = Gauge("hami_mt_webhook_audit_violations",
                                      "Objects the last audit pass found that admission denies (a failure) "
                                      "or would deny (a warning), by rule and namespace; kept by the replica "
                                      "that audits (empty elsewhere).", ["rule", "namespace"], registry=r)
        self.audit_duration = Gauge("hami_mt_webhook_audit_duration_seconds",
                                    "How long the last audit pass took, reading included.", registry=r)
        self.audit_last_success = Gauge("hami_mt_webhook_audit_last_success_timestamp_seconds",
                                        "Unix time at which this replica last finished an audit pass.",
                                        registry=r)
        self.audit_interval = Gauge("hami_mt_webhook_audit_interval_seconds",
                                    "Seconds between audit passes (--audit-interval); 0 while the audit is off.",
                                    registry=r)
        self.audit_leader = Gauge("hami_mt_webhook_audit_leader",
                                  "1 on the replica that holds the audit's Lease.", registry=r)
        self.audit_requests = Counter("hami_mt_webhook_audit_api_requests",
                                      "Requests the audit made of the API server, by verb and resource.",
                                      ["verb", "resource"], registry=r)
        self._violations: set[tuple[str, str]] = set()
        self._peers_measured: set[str] = set()
        for state in PEER_STATES:
            self.peers.labels(state).set(0)
        for verdict in ("answering", "not_answering"):
            self.peer_verdicts.labels(verdict)

    def _child(self, metric: Any, *labels: str) -> Any:
        """A labelled series, looked up once: prometheus_client's own lookup takes a lock every time."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def review(self, webhook: str, request: dict[str, Any] | None, decision: Decision | None,
               seconds: float) -> None:
        if decision is None:
            self._child(self.bad_requests, webhook).inc()
            return
        operation = request.get("operation") if request else None
        if operation not in OPERATIONS:  # label values from a request must not grow the series without bound
            operation = "other"
        dry = "true" if request and request.get("dryRun") is True else "false"
        result = "patched" if decision.changes else ("allowed" if decision.allowed else "denied")
        self.answered.count(webhook, operation, dry, result, seconds, decision)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def connection_closed(self, reason: str) -> None:
        self._child(self.connections_closed, reason).inc()

    def probe_connection_closed(self, reason: str) -> None:
        self._child(self.probe_connections_closed, reason).inc()

    def peers_seen(self, **counts: int) -> None:
        """How many other replicas this one hears, does not hear, and disputes (`PEER_STATES`)."""
        for state, n in counts.items():
            self._child(self.peers, state).set(n)

    def peer_failures(self, shares: dict[str, float | None]) -> None:
        """Each peer's share of failed probes (None: not known yet); a peer gone loses its series, so pods
        replaced in a rollout do not pile up."""
        for gone in self._peers_measured - shares.keys():
            self.peer_failure_ratio.remove(gone)
            self._children.pop((id(self.peer_failure_ratio), gone), None)
        self._peers_measured = set(shares)
        for peer, share in shares.items():
            self._child(self.peer_failure_ratio, peer).set(float("nan") if share is None else share)

    def peer_verdict(self, answering: bool) -> None:
        self._child(self.peer_verdicts, "answering" if answering else "not_answering").inc()

    def audit_done(self, violations: Mapping[tuple[str, str], int], seconds: float) -> None:
        """A finished pass: its violations replace the last pass's (a fixed one's series goes)."""
        for gone in self._violations - violations.keys():
            self.audit_violations.remove(*gone)
        self._violations = set(violations)
        for (rule, namespace), n in violations.items():
            self.audit_violations.labels(rule, namespace).set(n)
        self.audit_duration.set(seconds)
        self.audit_last_success.set_to_current_time()

    def audit_lost(self) -> None:
        """This replica no longer audits: its violations are the new auditor's to export."""
        for gone in self._violations:
            self.audit_violations.remove(*gone)
        self._violations = set()
        self.audit_leader.set(0)


#: Bounds of hami_mt_webhook_review_duration_seconds, in seconds.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class ReviewCounts(Collector):
    """The series every review updates (reviews, their duration, mutations, denials, would-deny), kept as
    plain counts and turned into metric families only when scraped.

    prometheus_client takes a lock on every update of every series, five or more per review; the reviews are
    all counted on the event loop's thread, where a scrape is answered too, so plain dicts are enough. The
    exposition is the same as that of the Counter and Histogram these replace."""

    def __init__(self) -> None:
        self.reviews: dict[tuple[str, str, str, str], int] = {}
        self.durations: dict[str, list[float]] = {}  # webhook -> a count per bucket (+Inf last), then the sum
        self.mutations: dict[str, int] = {}
        self.denials: dict[tuple[str, str], int] = {}
        self.would_deny: dict[str, int] = {}

    def count(self, webhook: str, operation: str, dry: str, result: str, seconds: float,
              decision: Decision) -> None:
        key = (webhook, operation, dry, result)
        self.reviews[key] = self.reviews.get(key, 0) + 1
        slots = self.durations.get(webhook)
        if slots is None:
            slots = self.durations[webhook] = [0.0] * (len(DURATION_BUCKETS) + 2)
        slots[bisect_left(DURATION_BUCKETS, seconds)] += 1
        slots[-1] += seconds
        for kind in decision.mutations:
            self.mutations[kind] = self.mutations.get(kind, 0) + 1
        for rule in decision.would_deny:
            self.would_deny[rule] = self.would_deny.get(rule, 0) + 1
        if not decision.allowed:
            denial = (webhook, decision.reason or "other")
            self.denials[denial] = self.denials.get(denial, 0) + 1

    def collect(self) -> Iterator[Metric]:
        reviews = CounterMetricFamily("hami_mt_webhook_reviews", "Admission reviews answered.",
                                      labels=["webhook", "operation", "dry_run", "result"])
        for labels, n in self.reviews.items():
            reviews.add_metric(list(labels), n)
        yield reviews
        duration = HistogramMetricFamily(
            "hami_mt_webhook_review_duration_seconds",
            "Time to answer one review, from the body read to the response built.", labels=["webhook"])
        for webhook, slots in self.durations.items():
            running, buckets = 0.0, []
            for bound, seen in zip((*DURATION_BUCKETS, float("inf")), slots[:-1], strict=True):
                running += seen
                buckets.append((floatToGoString(bound), running))
            duration.add_metric([webhook], buckets, sum_value=slots[-1])
        yield duration
        for name, help_text, label_names, counts in (
                ("hami_mt_webhook_mutations", "Changes made to pods, by kind.", ["kind"], self.mutations),
                ("hami_mt_webhook_denials", "Pods denied, by reason.", ["webhook", "reason"], self.denials),
                ("hami_mt_webhook_would_deny", "Denials answered as warnings under --enforcement warn or a "
                 "namespace labelled hami.io/enforcement: warn, by the rule that would have denied.",
                 ["rule"], self.would_deny)):
            family = CounterMetricFamily(name, help_text, labels=label_names)
            for key, n in counts.items():
                family.add_metric(list(key) if isinstance(key, tuple) else [key], n)
            yield family
