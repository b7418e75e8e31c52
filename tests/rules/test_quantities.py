"""Whole-number quantities and the tier sets T(C) (SPEC.md §2, §3.2)."""

from decimal import Decimal

import pytest

from hami_mt_webhook.rules.quantities import QuantityError, gib, parse, snap_up, tiers, valid_set, whole

#: apimachinery's TestQuantityParse table (k8s.io/apimachinery v0.37.2, pkg/api/resource/quantity_test.go):
#: the text and the value it parses to, as (integer, power of ten).
APIMACHINERY_VALID = [
    ('0', 0, 0), ('0n', 0, 0), ('0u', 0, 0), ('0m', 0, 0), ('0Ki', 0, 0), ('0k', 0, 0), ('0Mi', 0, 0), ('0M', 0, 0),
    ('0Gi', 0, 0), ('0G', 0, 0), ('0Ti', 0, 0), ('0T', 0, 0), ('1', 1, 0), ('1Ki', 1024, 0), ('8Ki', 8192, 0),
    ('7Mi', 7340032, 0), ('6Gi', 6442450944, 0), ('5Ti', 5497558138880, 0), ('4Pi', 4503599627370496, 0),
    ('3Ei', 3458764513820540928, 0), ('10Ti', 10995116277760, 0), ('100Ti', 109951162777600, 0), ('5n', 5, -9),
    ('4u', 4, -6), ('3m', 3, -3), ('9', 9, 0), ('8k', 8, 3), ('50k', 5, 4), ('7M', 7, 6), ('6G', 6, 9),
    ('5T', 5, 12), ('40T', 4, 13), ('300T', 3, 14), ('2P', 2, 15), ('1E', 1, 18), ('1E-3', 1, -3), ('1e3', 1, 3),
    ('1E6', 1, 6), ('1e9', 1, 9), ('1E12', 1, 12), ('1e15', 1, 15), ('1E18', 1, 18), ('1e14', 1, 14),
    ('1e13', 1, 13), ('1e3', 1, 3), ('100.035k', 100035, 0), ('0.001', 1, -3), ('0.0005k', 5, -1), ('0.005', 5, -3),
    ('0.05', 5, -2), ('0.5', 5, -1), ('0.00050k', 5, -1), ('0.00500', 5, -3), ('0.05000', 5, -2), ('0.50000', 5, -1),
    ('0.5e0', 5, -1), ('0.5e-1', 5, -2), ('0.5e-2', 5, -3), ('0.5e0', 5, -1), ('10.035M', 10035, 3),
    ('1.2e3', 12, 2), ('1.3E+6', 13, 5), ('1.40e9', 14, 8), ('1.53E12', 153, 10), ('1.6e15', 16, 14),
    ('1.7E18', 17, 17), ('9.01', 901, -2), ('8.1k', 81, 2), ('7.123456M', 7123456, 0),
    ('6.987654321G', 6987654321, 0), ('5.444T', 5444, 9), ('40.1T', 401, 11), ('300.2T', 3002, 11), ('2.5P', 25, 14),
    ('1.01E', 101, 16), ('3.001n', 4, -9), ('1.1E-9', 2, -9), ('0.0000000001', 1, -9), ('0.0000000005', 1, -9),
    ('0.00000000050', 1, -9), ('0.5e-9', 1, -9), ('0.9n', 1, -9), ('0.00000012345', 124, -9),
    ('0.00000012354', 124, -9), ('12E', 12, 18), ('100.035Ki', 10243584, -2), ('0.5Mi', 5242880, -1),
    ('0.05Gi', 536870912, -1), ('0.025Ti', 274877906944, -1), ('0.000000000001Ki', 2, -9), ('.001', 1, -3),
    ('.0001k', 100, -3), ('1.', 1, 0), ('1.G', 1, 9),
]
APIMACHINERY_SATURATED = ['9Ei', '9223372036854775807Ki']  # binary values beyond 2**63 - 1 are capped there
APIMACHINERY_INVALID = ['1.1.M', '1+1.0M', '0.1mi', '0.1am', 'aoeu', '.5i', '1i', '-3.01i', '-3.01e-', ' 1', '1 ']


@pytest.mark.parametrize(("text", "integer", "power"), APIMACHINERY_VALID)
def test_the_parser_reads_apimachinerys_table(text, integer, power):
    assert parse(text) == Decimal(integer).scaleb(power)


@pytest.mark.parametrize("text", APIMACHINERY_SATURATED)
def test_binary_values_saturate_like_apimachinery(text):
    assert parse(text) == 2**63 - 1


@pytest.mark.parametrize("text", [*APIMACHINERY_INVALID, "１", "1_6", "1_000", "٣", "²", "1\u00a0", "1e", "1K", "",
                                  "--1", "1.5.", "0x10", "1e+"])
def test_the_parser_refuses_what_apimachinery_refuses(text):
    with pytest.raises(ValueError):
        parse(text)


@pytest.mark.parametrize(("text", "value"), [("+", 0), (".", 0), ("1.", 1), (".5", Decimal("0.5")), ("1E", 10**18),
                                             ("0.9999999999", 1), ("1e-12", Decimal("1e-9")),
                                             ("1e4294967296", 1), ("Ki", 0)])  # Go keeps the exponent in an int32
def test_the_parsers_corners_match_go(text, value):
    assert parse(text) == value


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
    ("9" * 70, "not a quantity"), ("1e999999", "far too large"), (10**30, "far too large"),
    ("１", "not a quantity"), ("1_6", "not a quantity"), ("1e", "not a quantity")])
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
