"""§4.4: hami-scheduler puts every slice container of a pod on one card, so their fills must fit one card."""

from __future__ import annotations

from collections.abc import Sequence

from .capacity import Candidates
from .config import CORES_PER_CARD, Config
from .decision import Denied
from .fill import Fill
from .quantities import gib
from .slots import Slot

#: Denials name at most this many containers, then say how many more.
NAMED = 3


def one_card(fills: Sequence[tuple[Slot, Fill]], cands: Candidates, config: Config) -> int:
    """How many cards the pod takes (what hami-scheduler reads from its gpu-num annotation), or Denied when
    its containers cannot share the one card they are given."""
    if len(fills) < 2:
        return max((f.cards for _, f in fills), default=1)
    names = _names([s for s, _ in fills])
    for slot, f in fills:
        if f.cards > 1:
            raise Denied(f"{names} ask for slices and share one card, so none may take {config.vgpu} "
                         f"{f.cards}: give {slot.label} its own pod, or use one container", "one-card")
    together = [(s, f) for s, f in fills if s.shares_card_time]
    largest = max(cands.capacities)
    memory = sum(f.values.get(config.memory, 0) for _, f in together)
    cores = sum(f.values.get(config.core, 0) for _, f in together)
    if memory > largest:
        raise Denied(f"{_names([s for s, _ in together])} share one card but ask for {config.memory} "
                     f"{memory} ({gib(memory)}) together, more than the largest card, {largest} "
                     f"({gib(largest)}); lower their sgpu-memory or split them into pods", "one-card")
    if cores > CORES_PER_CARD:
        raise Denied(f"{_names([s for s, _ in together])} share one card but ask for {config.core} {cores} "
                     f"together, more than the {CORES_PER_CARD} of one card; lower their {config.core} "
                     "or split them into pods", "one-card")
    return 1


def _names(slots: Sequence[Slot]) -> str:
    """The containers' labels, the first NAMED of a long list and how many more (a denial stays readable)."""
    if len(slots) <= NAMED + 1:  # "and 1 more" would save nothing
        return ", ".join(s.label for s in slots)
    return f"{', '.join(s.label for s in slots[:NAMED])} and {len(slots) - NAMED} more containers"
