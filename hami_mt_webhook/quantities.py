"""Whole-number quantities and the valid sgpu-memory tiers."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity

#: Larger values are refused before arithmetic: no card or node comes near, and huge exponents are costly.
MAX_QUANTITY = 10**15


class QuantityError(ValueError):
    """A slice quantity that is not a usable whole number; `why` completes "the value is ..."."""

    def __init__(self, value: object, why: str) -> None:
        super().__init__(f"{value!r} is {why}")
        self.why = why


def whole(value: object) -> int:
    """Read a Kubernetes quantity that must be a whole number ("32", "32.0" and "2k" are; "1.5" is not)."""
    if isinstance(value, str):
        return _whole_text(value)
    if isinstance(value, bool) or value is None:
        raise QuantityError(value, "not a quantity")
    if isinstance(value, int):
        return _checked(value, Decimal(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(value, "not a quantity")
        return _checked(value, Decimal(repr(value)))
    raise QuantityError(value, "not a quantity")


@lru_cache(maxsize=1024)
def _whole_text(text: str) -> int:
    """Cached: the same few quantity strings arrive on every review (errors are not cached)."""
    if not text or len(text) > 64 or text != text.strip():
        raise QuantityError(text, "not a quantity")
    try:
        number = parse_quantity(text)
    except (ValueError, InvalidOperation, ArithmeticError):
        raise QuantityError(text, "not a quantity") from None
    return _checked(text, number)


def _checked(value: object, number: Decimal) -> int:
    if not number.is_finite():
        raise QuantityError(value, "not a quantity")
    if abs(number) > MAX_QUANTITY:
        raise QuantityError(value, "far too large")
    if number != number.to_integral_value():
        raise QuantityError(value, "not a whole number")
    return int(number)


@lru_cache(maxsize=256)
def tiers(capacity: int) -> tuple[int, ...]:
    """T(C): the powers of two from 2 below the card's capacity, and the capacity itself."""
    out = []
    power = 2
    while power < capacity:
        out.append(power)
        power *= 2
    out.append(capacity)
    return tuple(out)


@lru_cache(maxsize=256)
def valid_set(capacities: frozenset[int]) -> tuple[int, ...]:
    """The union of T(C) over the candidate capacities, sorted."""
    return tuple(sorted({t for c in capacities for t in tiers(c)}))


def snap_up(units: int, valid: Iterable[int]) -> int | None:
    """The smallest valid tier at or above `units`, or None when every tier is smaller."""
    for tier in sorted(valid):
        if tier >= units:
            return tier
    return None


def gib(units: int) -> str:
    """Say sgpu-memory units (512 MiB each) the way a person reads them."""
    mib = units * 512
    if mib % 1024 == 0:
        return f"{mib // 1024} GiB"
    if mib >= 1024:
        return f"{mib / 1024:g} GiB"
    return f"{mib} MiB"


def listing(values: Iterable[int]) -> str:
    """Join tiers for a message: '2, 4, 8'."""
    return ", ".join(str(v) for v in values)
