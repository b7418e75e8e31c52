"""The slice values of one container: checked, filled and snapped to a valid tier (SPEC.md §3.2–§3.6)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .capacity import Candidates
from .config import CARD_SIZES, CORES_PER_CARD, Config
from .decision import Denied
from .quantities import MAX_QUANTITY, QuantityError, gib, listing, snap_up, valid_set, whole
from .slots import Slot
from .text import show


@dataclass(frozen=True)
class Fill:
    """What the rules decided for one container: its slice values, and what they tell the user about them."""

    cards: int
    values: Mapping[str, int]  # slice resource -> value, written to both limits and requests
    warnings: tuple[str, ...] = ()
    mutations: tuple[str, ...] = ()  # kinds of change: copy-to-limits, vendor-form, exclusive, snap, ...


def fill(slot: Slot, cands: Candidates, config: Config) -> Fill:
    """§3.2–§3.6 for one container that asks for slices; raises Denied when no value can be written."""
    warnings: list[str] = []
    mutations: list[str] = []
    n, m, k = (quantity(slot, r, config) for r in config.slices)
    for resource, value in zip(config.slices, (n, m, k), strict=True):
        if value is not None and value < 1:
            raise Denied(f"{slot.label}: {resource} {value} is not valid: use {_expected(resource, config)}",
                         "range")
        if value is not None and resource not in slot.limits:
            warnings.append(f"{slot.label}: {resource} {value} was set only in requests; "
                            "copied to limits, which Kubernetes requires for extended resources")
            mutations.append("copy-to-limits")
    largest = max(cands.capacities)

    if n is None:  # §3.3: the vendor scheduler's form
        n = 1
        warnings.append(f"{slot.label}: {config.vgpu} 1 added: slices without {config.vgpu} are the vendor "
                        "scheduler's form, and HAMi accounts for slices through it")
        mutations.append("vendor-form")
    if cands.max_cards is not None and n > cands.max_cards:
        raise Denied(f"{slot.label}: {config.vgpu} {n} is more than any node it could run on has: the "
                     f"largest has {cands.max_cards} sliced card{'s' if cands.max_cards > 1 else ''}",
                     "capacity")

    if n > 1:  # §3.5: whole cards, all from one node that slices at least n of them
        cands = cands.holding(n)
        largest = max(cands.capacities)
        cores, memory = CORES_PER_CARD * n, largest * n
        # The fill itself must be a quantity the rules accept on the next review (§4.7).
        if memory > MAX_QUANTITY:
            raise Denied(f"{slot.label}: {config.vgpu} {n} is far too large: {n} cards of {largest} units "
                         f"would be {memory} units of {config.memory}", "range")
        if (k is not None and k != cores) or (m is not None and m != memory):
            given = ", ".join(f"{r} {v}" for r, v in ((config.memory, m), (config.core, k)) if v is not None)
            raise Denied(f"{slot.label}: {config.vgpu} {n} with {given}: multi-card requests take whole "
                         f"cards: remove {config.memory} and {config.core} (they are filled as {memory} "
                         f"and {cores})", "multi-card")
        if k is None or m is None:
            note = _capacity_note(cands, config, n)
            warnings.append(f"{slot.label}: {config.vgpu} {n} takes {n} whole cards: set {config.core} "
                            f"{cores} and {config.memory} {memory} ({gib(memory)}){note}")
            mutations.append("multi-card")
        return _fill(n, {config.vgpu: n, config.memory: memory, config.core: cores}, warnings, mutations)

    if m is None and k is None:  # §3.4: exclusive
        warnings.append(f"{slot.label}: {config.vgpu} 1 alone takes a whole card: set {config.core} "
                        f"{CORES_PER_CARD} and {config.memory} {largest} ({gib(largest)})"
                        f"{_capacity_note(cands, config)}")
        mutations.append("exclusive")
        values = {config.vgpu: 1, config.memory: largest, config.core: CORES_PER_CARD}
        return _fill(1, values, warnings, mutations)

    if m is None:
        raise Denied(f"{slot.label}: {config.core} {k} without {config.memory}: add {config.memory} "
                     f"(valid: {listing(valid_set(cands.capacities))}), or drop {config.core} to take the "
                     "whole card", "core-without-memory")
    if k is not None and k > CORES_PER_CARD:
        raise Denied(f"{slot.label}: {config.core} {k} is not valid: a card has {CORES_PER_CARD}, so use 1 "
                     f"to {CORES_PER_CARD}, or {config.vgpu} 2 or more for whole cards", "range")
    valid = valid_set(cands.capacities)
    if m not in valid:
        tier = snap_up(m, valid)
        if tier is None:
            raise Denied(f"{slot.label}: {config.memory} {m} ({gib(m)}) is more than the largest card, "
                         f"{largest} ({gib(largest)}); valid values: {listing(valid)}", "capacity")
        warnings.append(f"{slot.label}: {config.memory} {m} ({gib(m)}) snapped up to {tier} ({gib(tier)}), "
                        f"the next valid tier ({listing(valid)}); write {tier} in the manifest: a pod's "
                        f"resources cannot change, so re-applying a pod manifest that says {m} fails"
                        f"{_size_note(tier, config) if tier in cands.capacities else ''}")
        mutations.append("snap")
        m = tier
    if k is None:
        warnings.append(f"{slot.label}: {config.memory} {m} without {config.core}: the runtime's default "
                        "compute weight applies, 1, the lowest (a time-slice weight, not a guaranteed "
                        f"share); add {config.core} 1 to {CORES_PER_CARD} for a larger weight")
    values = {config.vgpu: 1, config.memory: m} | ({} if k is None else {config.core: k})
    return _fill(1, values, warnings, mutations)


def _fill(cards: int, values: dict[str, int], warnings: list[str], mutations: list[str]) -> Fill:
    return Fill(cards, values, tuple(warnings), tuple(mutations))


def quantity(slot: Slot, resource: str, config: Config) -> int | None:
    """The container's value for `resource`, checked to be whole and the same in limits and requests."""
    values = {}
    for part, source in (("limit", slot.limits), ("request", slot.requests)):
        if resource not in source:
            continue
        raw = source[resource]
        shown = show(raw)
        if resource == config.memory and isinstance(raw, str) and raw.endswith(("Ki", "Mi", "Gi", "Ti")):
            raise Denied(f"{slot.label}: {resource} {part} {shown} is a byte size, but {resource} counts "
                         "512 MiB units: write 2 for 1 GiB, 32 for 16 GiB", "quantity")
        try:
            values[part] = whole(raw)
        except QuantityError as err:
            raise Denied(f"{slot.label}: {resource} {part} {shown} is {err.why}; "
                         f"use {_expected(resource, config)}", "quantity") from None
    if len(values) == 2 and values["limit"] != values["request"]:
        raise Denied(f"{slot.label}: {resource} limit {values['limit']} and request {values['request']} "
                     "differ; set them to the same value", "limits-requests")
    return values.get("limit", values.get("request"))


def same(raw: Any, value: int) -> bool:
    """Whether a container's raw quantity already is `value` ("32", 32 and "3.2e1" all are 32)."""
    try:
        return raw is not None and whole(raw) == value
    except QuantityError:
        return False


def _expected(resource: str, config: Config) -> str:
    if resource == config.vgpu:
        return "a whole number of cards, 1 or more"
    if resource == config.core:
        return f"a whole number of sixteenths of a card, 1 to {CORES_PER_CARD}"
    return "a positive whole number of 512 MiB units, e.g. 32 for 16 GiB"


def _capacity_note(cands: Candidates, config: Config, cards: int = 1) -> str:
    """What a fill's warning adds about the capacity it used: mixed candidates, or a size no card has (§2).

    For a multi-card fill `cands` are already the nodes that can hold all its cards (§3.5), and the note
    names only theirs."""
    note = ""
    if len(cands.capacities) > 1:
        where = ("the pod could land on" if cards == 1 else
                 f"the pod's {cards} cards could come from nodes with")
        note = (f"; {where} cards of {listing(sorted(cands.capacities))} units, so the largest was "
                "taken: pin a card model with a nodeSelector to get its exact capacity")
    return note + _size_note(max(cands.capacities), config)


def _size_note(capacity: int, config: Config) -> str:
    """§2: a per-card capacity no card has is used as reported, and every value written from it says so."""
    if config.known_size(capacity):
        return ""
    known = listing(sorted(CARD_SIZES | set(config.memory_per_card)))
    return (f"; {capacity} units a card is not a known card size ({known}): the node's reported "
            f"{config.memory} likely includes the vendor's overcommit_ratio, which HAMi's scheduler "
            "accounts against too, so the card's memory is oversubscribed")
