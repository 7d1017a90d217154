"""The typed config reader (traces/fields.py) and the unit parsers it uses (traces/units.py):
every value is of its type (bool is not int, 1.0 is not 1), finite, and within its bounds."""

import math
import re

import pytest

from traces.errors import ConfigError, show
from traces.fields import (
    Fields,
    binary_size,
    check_bool,
    check_choice,
    check_fraction,
    check_int,
    check_number,
    decimal_rate,
)
from traces.units import parse_bandwidth, parse_size, parse_time


def raises(message: str):
    return pytest.raises(ConfigError, match=re.escape(message))


def test_show_is_short_and_safe_on_huge_and_deep_values():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert show(deep) == "[[[...]]]"
    assert show(10**400) == "1000000000...00000000000"
    assert len(show("x" * 10**6)) < 50 and show("bf16") == "'bf16'"


@pytest.mark.parametrize("value", [True, 1.0, "1", None, [1]])
def test_an_integer_is_an_int_and_nothing_else(value):
    with raises(f"n: {show(value)} must be an integer"):
        check_int(value, "n", minimum=0, maximum=10)


def test_integer_bounds_compare_exactly_at_any_size():
    assert check_int(10, "n", minimum=1, maximum=10) == 10
    with raises("n: 11 must be an integer from 1 to 10"):
        check_int(11, "n", minimum=1, maximum=10)
    with raises("n: 1000000000...00000000000 must be an integer from 1 to 10"):
        check_int(10**400, "n", minimum=1, maximum=10)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400, 1e-300, 2.5])
def test_numbers_out_of_range_or_not_finite_are_refused(value):
    with pytest.raises(ConfigError, match=r"^x: .* must be at least 0.001 s and at most 2 s$"):
        check_number(value, "x", minimum=1e-3, maximum=2, unit=" s")


def test_numbers_within_bounds_come_back_as_floats():
    assert check_number(2, "x", minimum=0, maximum=2) == 2.0
    assert type(check_number(2, "x", minimum=0, maximum=2)) is float
    with raises("x: 0 must be above 0 and at most 1"):
        check_number(0, "x", minimum=0, maximum=1, above=True)
    with raises("x: True must be a number"):
        check_number(True, "x", minimum=0, maximum=1)


@pytest.mark.parametrize("value", [0, 1.5, True, math.nan, "0.5"])
def test_fractions_are_in_zero_one(value):
    with raises(f"f: {show(value)} must be a fraction in (0, 1]"):
        check_fraction(value, "f")
    assert check_fraction(1, "f") == 1.0


def test_choices_compare_type_as_well_as_value():
    assert check_choice(2, "tiers", (2, 3)) == 2
    for bad in (2.0, True, [2], {"a": 2}):
        with raises(f"tiers: {show(bad)} is not one of 2, 3"):
            check_choice(bad, "tiers", (2, 3))
    with raises("algo: ['ring'] is not one of auto, ring"):
        check_choice(["ring"], "algo", ("auto", "ring"))
    with raises("sp: 1 must be true or false"):
        check_bool(1, "sp")


def test_fields_read_keys_with_defaults_and_name_the_table():
    fields = Fields.of({"nodes": 4, "rate": "400Gb/s", "lat": "2us", "size": "16M"}, "cluster")
    assert fields.integer("nodes", 1, minimum=1, maximum=8) == 4
    assert fields.integer("absent", 7, minimum=1, maximum=8) == 7
    assert fields.bandwidth("rate", 0.0) == 50e9
    assert fields.time("lat", 0.0) == pytest.approx(2e-6)
    assert fields.size("size", 0) == 16 * 2**20
    with raises("cluster.nodes: 4 must be an integer from 5 to 8"):
        fields.integer("nodes", 1, minimum=5, maximum=8)
    with raises("cluster.colour: unknown key (known: nodes, rate, lat, size)"):
        Fields.of({**fields.table, "colour": 1}, "cluster").known(("nodes", "rate", "lat", "size"))


def test_a_table_must_be_a_table():
    for value in (5, [1], "x", None):
        with raises(f"sim: {show(value)} must be a table of keys"):
            Fields.of(value, "sim")
    assert Fields.of({"a": {"b": 1}}, "t").sub("a").name("b") == "t.a.b"
    with raises("t.a: 1 must be a table of keys"):
        Fields.of({"a": 1}, "t").sub("a")


def test_physical_bounds_are_stated_in_the_message():
    fields = Fields({"bw": "1e-4GB/s", "lat": "2s", "big": "200TB/s"}, "c")
    with raises("c.bw: '1e-4GB/s' must be from 1 MB/s to 100 TB/s"):
        fields.bandwidth("bw", 1.0)
    with raises("c.big: '200TB/s' must be from 1 MB/s to 100 TB/s"):
        fields.bandwidth("big", 1.0)
    with raises("c.lat: '2s' must be from 0 s to 1 s"):
        fields.time("lat", 0.0)
    assert decimal_rate(1e6) == "1 MB/s" and binary_size(2**40) == "1T"


def test_integer_lists():
    fields = Fields({"dims": [4, 4, 4], "bad": [4, 4.0], "long": [2] * 4}, "cluster")
    assert fields.integers("dims", (), lengths=(2, 3), minimum=2, maximum=64) == (4, 4, 4)
    with raises("cluster.bad: [4, 4.0] must be a list of 2 or 3 integers"):
        fields.integers("bad", (), lengths=(2, 3), minimum=2, maximum=64)
    with raises("cluster.long: [2, 2, 2, 2] must be a list of 2 or 3 integers"):
        fields.integers("long", (), lengths=(2, 3), minimum=2, maximum=64)


# --- units ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ("1e400s", "t: '1e400s' is not a finite number"),
    (math.inf, "t: inf is not a finite number"),
    (math.nan, "t: nan is not a finite number"),
    (10**400, "t: 1000000000...00000000000 is not a finite number"),
    ("-1us", "t: '-1us' is not a time"),
    (-1, "t: -1 must not be negative"),
    ("1" * 100 + "s", "t: '11111111111111111...11111111111111111s' is not a time"),
    (["1s"], "t: ['1s'] is not a time"),
])
def test_times_are_finite_and_not_negative(text, message):
    with raises(message):
        parse_time(text, "t")


@pytest.mark.parametrize(("text", "message"), [
    ("1e400GB/s", "b: '1e400GB/s' is not a finite number"),
    (math.inf, "b: inf is not a finite number"),
    (0, "b: 0 must be a positive bandwidth"),
    (True, "b: True is not a bandwidth"),
])
def test_bandwidths_are_finite_and_positive(text, message):
    with raises(message):
        parse_bandwidth(text, "b")


@pytest.mark.parametrize(("text", "message"), [
    ("99999999999999999999T", "s: '99999999999999999999T' is too large (at most 1,099,511,627,776"),
    (10**400, "s: 1000000000...00000000000 is too large"),
    ("9" * 400, "s: '9999999999999999" ),
    (1.5e6, "s: 1500000.0 is not a size"),
    (True, "s: True is not a size"),
    ("1.5", "s: '1.5' is not a whole number of bytes"),
    (0, "s: 0 must be a positive number of bytes"),
])
def test_sizes_are_whole_positive_and_bounded(text, message):
    with raises(message):
        parse_size(text, "s")


def test_sizes_parse_as_nccl_tests_counts():
    assert parse_size("16M", "s") == 16 * 2**20 and parse_size("1T", "s") == 2**40
    assert parse_size(4096, "s") == 4096
    assert parse_size("2G", "s", maximum=2**31) == 2**31


@pytest.mark.parametrize(("text", "seconds"), [
    ("5min", 300.0), ("24h", 86_400.0), ("2d", 172_800.0), ("1.5 h", 5400.0), ("10ms", 0.01)])
def test_durations_take_minutes_hours_and_days(text, seconds):
    assert parse_time(text, "t") == pytest.approx(seconds, rel=1e-15)


def test_m_is_not_a_unit_of_time():
    with raises("t: '5m' is not a time"):
        parse_time("5m", "t")
