"""Node reports of sliced cards, and which capacities a pod could land on.

A node's capacity says how many sliced cards it has (`sgpu-core` / 16) and how much memory each
holds (`sgpu-memory` / cards). The view keeps one small record per sliced node and a summary of
the whole cluster, so a pod with no placement constraints is answered without looking at nodes.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .config import CORES_PER_CARD, Config
from .quantities import QuantityError, whole
from .selectors import labels_match, term_matches
from .text import clip

__all__ = ["ClusterView", "NodeReport", "OncePerNode", "report"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the rules need of one sliced node."""

    name: str
    labels: Mapping[str, str]
    cards: int
    per_card: int


@dataclass(frozen=True, slots=True)
class Candidates:
    """The capacities a pod may get, and how many sliced cards the biggest candidate node has."""

    capacities: frozenset[int]
    max_cards: int | None  # None: no node reports, so the card count is unknown
    from_nodes: bool
    #: (capacity, the most sliced cards one candidate node of that capacity has); empty without reports.
    most_cards: tuple[tuple[int, int], ...] = ()

    def holding(self, cards: int) -> Candidates:
        """The candidates narrowed to nodes that slice at least `cards` cards (§3.5).

        HAMi's scheduler takes all of a container's cards from one node, so a node that slices fewer can
        never hold it, and its capacity is not one a multi-card fill may use. Without node reports the
        card counts are unknown and the fallback stands (§3.4). Callers deny `cards` above `max_cards`
        first, so the result is never empty.
        """
        if cards <= 1 or not self.most_cards:
            return self
        kept = tuple((c, n) for c, n in self.most_cards if n >= cards)
        if len(kept) == len(self.most_cards):
            return self
        return Candidates(frozenset(c for c, _ in kept), max(n for _, n in kept), self.from_nodes, kept)


def _from_shapes(shapes: Iterable[tuple[int, int]]) -> Candidates:
    """Candidates from the (per-card capacity, sliced cards) of the nodes a pod could land on."""
    most: dict[int, int] = {}
    for per_card, cards in shapes:
        if cards > most.get(per_card, 0):
            most[per_card] = cards
    return Candidates(frozenset(most), max(most.values()), True, tuple(sorted(most.items())))


def report(node: Mapping[str, Any], config: Config) -> NodeReport | None:
    """Read a Node object; None when it has no usable sliced cards."""
    metadata = node.get("metadata") or {}
    name = metadata.get("name") or ""
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    if not isinstance(capacity, Mapping) or config.core not in capacity:
        return None
    try:
        cores = whole(capacity.get(config.core))
        memory = whole(capacity.get(config.memory, 0))
    except QuantityError as err:
        _IGNORED.warn(name, f"node {clip(name)}: ignoring unreadable sliced capacity ({err})")
        return None
    if cores <= 0 or cores % CORES_PER_CARD or memory <= 0:
        if cores:
            _IGNORED.warn(name, f"node {clip(name)}: {config.core}={cores}, {config.memory}={memory} is not "
                                "a sliced-card report; ignored")
        return None
    cards = cores // CORES_PER_CARD
    per_card = memory // cards
    if per_card < 2:
        _IGNORED.warn(name, f"node {clip(name)}: {per_card} units per card is below the smallest "
                            "slice; ignored")
        return None
    labels = metadata.get("labels") or {}
    if not isinstance(labels, Mapping):
        labels = {}
    # Most label values repeat across thousands of nodes (zone, arch, model): keep one copy of each.
    labels = {sys.intern(k): sys.intern(v) if isinstance(v, str) else v for k, v in labels.items()}
    return NodeReport(name=str(name), labels=labels, cards=cards, per_card=per_card)


class OncePerNode:
    """The last warning logged for each node: a node's status arrives again with every kubelet heartbeat,
    and SPEC §2 asks for one line per odd node, not one per event. A node is logged again when what is
    said of it changes, or after it was forgotten.

    `limit` bounds nodes never forgotten: past it everything is, and at worst a line is repeated.
    """

    def __init__(self, log: logging.Logger, limit: int | None = 10_000) -> None:
        self._log = log
        self._limit = limit
        self._said: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._said)

    def warn(self, name: str, message: str) -> None:
        if self._said.get(name) == message:
            return
        if self._limit is not None and len(self._said) >= self._limit:
            self._said.clear()
        self._said[name] = message
        self._log.warning("%s", message)

    def forget(self, name: str) -> None:
        """The node is fine again, or gone: its next warning is logged."""
        self._said.pop(name, None)

    def keep(self, names: Container[str]) -> None:
        """Forget every node not in `names` (a complete set: the others are gone)."""
        if self._said:
            self._said = {name: said for name, said in self._said.items() if name in names}


#: Nodes whose reports `report` ignores.
_IGNORED = OncePerNode(logger)


class ClusterView:
    """The sliced nodes the webhook knows of, kept in memory from a Node watch."""

    def __init__(self, nodes: Iterable[NodeReport] = (), *, ready: bool = True) -> None:
        self._nodes: dict[str, NodeReport] = {}
        self._shapes: Counter[tuple[int, int]] = Counter()  # (per_card, cards) -> nodes
        self._summary: Candidates | None = None
        self._placed: dict[str, Candidates] = {}  # by placement constraint; cleared when a node changes
        self.ready = ready
        for node in nodes:
            self.upsert(node)

    @classmethod
    def from_nodes(cls, nodes: Iterable[Mapping[str, Any]], config: Config) -> ClusterView:
        """Build a ready view from Node objects, skipping those without sliced cards."""
        return cls(r for r in (report(n, config) for n in nodes) if r is not None)

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[NodeReport]:
        return iter(self._nodes.values())

    def upsert(self, node: NodeReport) -> None:
        old = self._nodes.get(node.name)
        if old == node:
            return
        if old is not None:
            self._drop_shape(old)
        self._nodes[node.name] = node
        self._shapes[(node.per_card, node.cards)] += 1
        self._summary = None
        self._placed.clear()

    def remove(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            self._drop_shape(old)
            self._summary = None
            self._placed.clear()

    def replace(self, nodes: Mapping[str, NodeReport]) -> None:
        """Swap in a complete set at once (a relist): nodes absent from it are gone, none half-applied."""
        self._nodes = dict(nodes)
        self._shapes = Counter((n.per_card, n.cards) for n in self._nodes.values())
        self._summary = None
        self._placed = {}

    def get(self, name: str) -> NodeReport | None:
        return self._nodes.get(name)

    def nonstandard(self, config: Config) -> int:
        """Sliced nodes whose per-card capacity is no known card size (overcommitted memory, §2).

        Counted from the per-shape summary, so it costs the number of distinct shapes, not of nodes.
        """
        return sum(count for (per_card, _), count in self._shapes.items() if not config.known_size(per_card))

    def _drop_shape(self, node: NodeReport) -> None:
        shape = (node.per_card, node.cards)
        self._shapes[shape] -= 1
        if self._shapes[shape] <= 0:
            del self._shapes[shape]

    def candidates(self, pod_spec: Mapping[str, Any], config: Config) -> Candidates:
        """Capacities of the sliced nodes this pod could land on, or the configured fallback."""
        selector = pod_spec.get("nodeSelector") or None
        terms = _required_terms(pod_spec)
        if not selector and terms is None:
            return self._all(config)
        # Pods of one workload share their constraints: remember the answer until a node changes.
        key = _constraint_key(selector, terms)
        found = self._placed.get(key) if key is not None else None
        if found is None:
            found = self._scan(selector, terms, config)
            if key is not None:
                if len(self._placed) >= MAX_CACHED_CONSTRAINTS:
                    self._placed.clear()
                self._placed[key] = found
        return found

    def explain(self, pod_spec: Mapping[str, Any], config: Config, cards: int = 1) -> str:
        """Which capacities `candidates` gives this pod and why (`review -v`): a selector that matches no
        sliced node falls back to memoryPerCard without a word, so say which of the two happened. `cards`,
        the most a container of the pod takes, adds the narrowing of a multi-card fill (§3.5)."""
        every = self._explain(pod_spec, config)
        found = self.candidates(pod_spec, config)
        if cards <= 1 or found.max_cards is None or cards > found.max_cards:
            return every
        held = found.holding(cards)
        if held is found:
            return every
        return (f"{every}; {cards} cards of one node: {', '.join(str(c) for c in sorted(held.capacities))} "
                f"from the nodes that slice {cards} or more")

    def _explain(self, pod_spec: Mapping[str, Any], config: Config) -> str:
        found = self.candidates(pod_spec, config)
        caps = f"per-card capacities {', '.join(str(c) for c in sorted(found.capacities))}"
        odd = [str(c) for c in sorted(found.capacities) if not config.known_size(c)]
        note = f"; {', '.join(odd)} is not a known card size (overcommitted memory?)" if odd else ""
        selector = pod_spec.get("nodeSelector") or None
        terms = _required_terms(pod_spec)
        if not self._nodes:
            return f"{caps} from --memory-per-card: no node reports sliced cards (give them with --nodes)"
        if selector is None and terms is None:
            every = "the one sliced node" if len(self._nodes) == 1 else f"all {len(self._nodes)} sliced nodes"
            return f"{caps} from {every}: the pod does not constrain its placement{note}"
        what = " and ".join(w for w, on in (("nodeSelector", selector is not None),
                                            ("required node affinity", terms is not None)) if on)
        matched = [n.name for n in self._nodes.values() if _matches(n, selector, terms)]
        if not matched:
            return (f"{caps} from --memory-per-card: its {what} matches none of the {len(self._nodes)} "
                    "sliced nodes (check their labels: kubectl get nodes --show-labels)")
        shown = ", ".join(matched[:3]) + (f" and {len(matched) - 3} more" if len(matched) > 3 else "")
        return f"{caps} from the sliced nodes its {what} allows: {shown}{note}"

    def _scan(self, selector: Any, terms: list[Mapping[str, Any]] | None, config: Config) -> Candidates:
        if terms is None and isinstance(selector, dict) and all(isinstance(v, str)
                                                                for v in selector.values()):
            wanted = selector.items()  # a plain nodeSelector: a sub-dict test, in C
            matched = [n for n in self._nodes.values() if wanted <= n.labels.items()]
        else:
            matched = [n for n in self._nodes.values() if _matches(n, selector, terms)]
        if not matched:
            return _fallback(config)
        return _from_shapes((n.per_card, n.cards) for n in matched)

    def _all(self, config: Config) -> Candidates:
        if not self._shapes:
            return _fallback(config)
        if self._summary is None:
            self._summary = _from_shapes(self._shapes)
        return self._summary


#: Distinct placement constraints remembered at once; past this the memory starts over.
MAX_CACHED_CONSTRAINTS = 4096


def _constraint_key(selector: Any, terms: Any) -> str | None:
    """A canonical text of the pod's placement constraints, or None when they cannot be keyed."""
    try:
        # Typed here: the compiled build sees orjson as untyped (setup.py), the linter through its stubs.
        key: str = orjson.dumps([selector, terms], option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return None
    return key


def _fallback(config: Config) -> Candidates:
    return Candidates(frozenset(config.memory_per_card), None, False)


def _required_terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    if not isinstance(node_affinity, Mapping):
        return None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        return None
    return [t for t in terms if isinstance(t, Mapping)]


def _matches(node: NodeReport, selector: Any, terms: list[Mapping[str, Any]] | None) -> bool:
    if selector:
        if not isinstance(selector, Mapping) or not labels_match(selector, node.labels):
            return False
    if terms is not None:
        # Terms are ORed; the requirements inside one term are ANDed.
        return any(term_matches(node.name, node.labels, term) for term in terms)
    return True
