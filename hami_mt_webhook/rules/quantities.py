"""Whole-number quantities and the valid sgpu-memory tiers."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import MAX_EMAX, MIN_EMIN, ROUND_UP, Decimal, InvalidOperation, localcontext
from functools import lru_cache

__all__ = ["QuantityError", "whole"]

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
        number = parse(text)
    except (ValueError, InvalidOperation, ArithmeticError):
        raise QuantityError(text, "not a quantity") from None
    return _checked(text, number)


_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() would take "１" and "²"
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
#: The largest binary-suffixed value Kubernetes keeps (larger ones saturate); 2**63 - 1.
_MAX_BINARY = Decimal(2**63 - 1)
_NANO = Decimal("1e-9")


def parse(text: str) -> Decimal:
    """A Kubernetes quantity, exactly as apimachinery's ParseQuantity reads it (ValueError if it would not).

    <quantity> ::= <sign>? <digits> ( "." <digits>? )? | "." <digits> followed by a suffix:
    n u m "" k M G T P E, Ki Mi Gi Ti Pi Ei, or e/E and a signed exponent. ASCII digits only, no spaces,
    no underscores. Values round up to the next nano unit, and binary-suffixed ones saturate at
    2**63 - 1, as the API server does.
    """
    if not text:
        raise ValueError("empty quantity")
    end, pos = len(text), 0
    negative = text[0] == "-"
    if text[0] in "+-":
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos == end:
        return Decimal(0)
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos != end:
        raise ValueError(f"not a quantity: {text[:64]!r}")
    suffix = text[suffix_start:]
    with localcontext() as ctx:  # exact: as many digits as the text has, exponents as large as Go's int32
        ctx.prec, ctx.Emax, ctx.Emin = 160, MAX_EMAX, MIN_EMIN
        amount = Decimal(f"{'-' if negative else ''}{num}.{denom or '0'}")
        if suffix in _DECIMAL:
            amount = amount.scaleb(_DECIMAL[suffix])
        elif suffix in _BINARY:
            amount = amount * (1 << _BINARY[suffix])
            if abs(amount) > _MAX_BINARY:
                amount = _MAX_BINARY.copy_sign(amount)
        elif len(suffix) > 1 and suffix[0] in "eE" and _is_int64(suffix[1:]):
            exponent = (int(suffix[1:]) + 2**31) % 2**32 - 2**31  # Go keeps it in an int32
            amount = amount.scaleb(exponent)
        else:
            raise ValueError(f"unknown suffix in {text[:64]!r}")
        places = amount.as_tuple().exponent  # an int: the amount is finite
        if isinstance(places, int) and places < -9:  # finer than a nano unit: up, away from zero
            amount = amount.quantize(_NANO, rounding=ROUND_UP)
        return amount


def _is_int64(text: str) -> bool:
    """Go's strconv.ParseInt(text, 10, 64) succeeds."""
    body = text[1:] if text[:1] in ("+", "-") else text
    return bool(body) and all(c in _DIGITS for c in body) and -(2**63) <= int(text) < 2**63


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
