"""Whole-number quantities and the tier sets T(C) (SPEC.md §2, §3.2)."""

import pytest

from hami_mt_webhook.quantities import QuantityError, gib, snap_up, tiers, valid_set, whole


@pytest.mark.parametrize(("raw", "value"), [
    ("32", 32), ("32.0", 32), ("2k", 2000), ("1Gi", 1073741824), ("2000m", 2), (7, 7), (7.0, 7), ("-1", -1),
    ("1e3", 1000), ("+3", 3)])
def test_whole_numbers_compare_numerically(raw, value):
    assert whole(raw) == value


@pytest.mark.parametrize(("raw", "why"), [
    ("1.5", "not a whole number"), ("500m", "not a whole number"), (7.5, "not a whole number"),
    ("abc", "not a quantity"), ("", "not a quantity"), ("0x10", "not a quantity"), (" 4", "not a quantity"),
    (None, "not a quantity"), (True, "not a quantity"), ({"a": 1}, "not a quantity"), ([1], "not a quantity"),
    (float("nan"), "not a quantity"), (float("inf"), "not a quantity"),
    ("9" * 70, "not a quantity"), ("1e999999", "far too large"), (10**30, "far too large")])
def test_everything_else_is_refused_with_a_reason(raw, why):
    with pytest.raises(QuantityError) as err:
        whole(raw)
    assert err.value.why == why


def test_tiers_match_the_seeds():
    assert tiers(96) == (2, 4, 8, 16, 32, 64, 96)
    assert tiers(160) == (2, 4, 8, 16, 32, 64, 128, 160)
    assert tiers(128) == (2, 4, 8, 16, 32, 64, 128)
    assert tiers(2) == (2,)
    assert tiers(3) == (2, 3)


def test_valid_set_is_the_union():
    assert valid_set(frozenset({96, 160})) == (2, 4, 8, 16, 32, 64, 96, 128, 160)


@pytest.mark.parametrize(("units", "tier"), [(1, 2), (2, 2), (20, 32), (65, 96), (97, 128), (160, 160), (161, None)])
def test_snap_up(units, tier):
    assert snap_up(units, valid_set(frozenset({96, 160}))) == tier


@pytest.mark.parametrize(("units", "text"), [(1, "512 MiB"), (2, "1 GiB"), (3, "1.5 GiB"), (160, "80 GiB")])
def test_gib(units, text):
    assert gib(units) == text
