"""Typed, bounded config values: the one place that says what an integer, a fraction, a
bandwidth or a choice may be, for every TOML table and JSON profile parasim reads.

Two layers. The `check_*` functions check one value wherever it comes from (a constructor's
`__post_init__` calls them, so a `Layout` built in code obeys the rules a TOML file does).
`Fields` reads the keys of one table through them: absent keys take the default, present keys
must pass, and every failure is a `ConfigError` of one line naming `table.key`, the value and
the rule:

    fields = Fields(table, "cluster")
    nodes = fields.integer("nodes", 1, minimum=1, maximum=MAX_ACCELERATORS)

The rules reject what a hostile or careless file may hold: `true` or `1.0` where an integer
belongs (bool is an int subclass in Python; TOML's 1.0 is a float), lists and tables where a
string belongs, NaN and infinities, integers beyond float range (10**400), and physical values
no machine has (the bounds below, each stated in the message).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from traces.errors import ConfigError, check_keys, show
from traces.units import MAX_SIZE_BYTES, parse_bandwidth, parse_size, parse_time

T = TypeVar("T")

# --- bounds on physical values (inclusive); the messages quote them -----------------------------
MAX_ACCELERATORS = 131_072
"""The most accelerators parasim simulates: 16,384 DGX H100 (131,072 GPUs) route and simulate
with the graph built lazily and routes by link arithmetic (`topology.links`; issue 23 measured
a 1 GiB all-reduce there in ~13 s and GPT-3 175B at DP 1024 in ~59 s on 2 loaded cores, under
1 GB)."""
MIN_BANDWIDTH_BPS = 1e6  # 1 MB/s: slower than any link a training step could use
MAX_BANDWIDTH_BPS = 1e14  # 100 TB/s: ~20x an H200's 4.8 TB/s HBM, the fastest link we model
MAX_LATENCY_S = 1.0  # a link or an op overhead of more than a second is a typo
MIN_TFLOPS = 1e-3  # 1 GFLOP/s
MAX_TFLOPS = 1e5  # 100 PFLOP/s per accelerator: ~100x an H100's dense bf16
MAX_MEMORY_BYTES = 100 * 2**40  # 100 TiB per accelerator
MIN_EFFICIENCY = 1e-6  # a kernel a million times under its roof is a typo, not a measurement
MIN_LINK_EFFICIENCY = 0.01
"""A link that carries data at under 1% of its signalling rate is broken, not slow: NCCL's
bus bandwidth on NVLink and InfiniBand is 70-95% of the line rate (nccl-tests' published
all_reduce results), and 1e-30 makes a step of 1e27 s."""


def _bad(name: str, value: object, rule: str) -> ConfigError:
    return ConfigError(f"{name}: {show(value)} {rule}")


def is_int(value: object) -> bool:
    """An integer, and not a bool (True is an int in Python, not in a config)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: object, name: str, *, minimum: int, maximum: int) -> int:
    """An integer in [minimum, maximum]."""
    if not is_int(value):
        raise _bad(name, value, "must be an integer")
    assert isinstance(value, int)
    if not minimum <= value <= maximum:
        raise _bad(name, value, f"must be an integer from {minimum:,} to {maximum:,}")
    return value


def check_number(value: object, name: str, *, minimum: float, maximum: float,
                 above: bool = False, unit: str = "") -> float:
    """A finite real number in [minimum, maximum] (in (minimum, maximum] with `above`)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _bad(name, value, "must be a number")
    low_ok = value > minimum if above else value >= minimum
    if not (low_ok and value <= maximum):  # NaN fails both; ints compare exactly, any size
        low = "above" if above else "at least"
        raise _bad(name, value, f"must be {low} {minimum:g}{unit} and at most {maximum:g}{unit}")
    return float(value)


def check_fraction(value: object, name: str) -> float:
    """A fraction in (0, 1], such as an efficiency."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 1:
        raise _bad(name, value, "must be a fraction in (0, 1]")
    return float(value)


def check_efficiency(value: object, name: str) -> float:
    """An efficiency: a fraction in [MIN_EFFICIENCY, 1] (a smaller one makes a kernel's time
    absurd, or not a number at all)."""
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not MIN_EFFICIENCY <= value <= 1:
        raise _bad(name, value, f"must be an efficiency in [{MIN_EFFICIENCY:g}, 1] (below "
                   f"{MIN_EFFICIENCY:g} a kernel runs a million times under its roof)")
    return float(value)


def check_link_efficiency(value: object, name: str) -> float:
    """A link's data efficiency: a fraction in [MIN_LINK_EFFICIENCY, 1]."""
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not MIN_LINK_EFFICIENCY <= value <= 1:
        raise _bad(name, value, f"must be a link efficiency in [{MIN_LINK_EFFICIENCY:g}, 1] "
                   "(the share of the line rate that carries data)")
    return float(value)


def check_line(value: object, name: str, *, maximum: int = 200) -> str:
    """A name: one printable line of 1 to `maximum` characters (it is quoted in messages)."""
    if not isinstance(value, str) or not value or len(value) > maximum \
            or not value.isprintable():
        raise _bad(name, value, f"must be one printable line of 1 to {maximum} characters")
    return value


def check_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, value, "must be true or false")
    return value


def check_string(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _bad(name, value, "must be a string")
    return value


def check_choice(value: object, name: str, options: Collection[T]) -> T:
    """One of `options`, compared by type as well (1.0 is not 1, true is not 1, ["a"] not "a")."""
    for option in options:
        if type(value) is type(option) and value == option:
            return option
    known = ", ".join(str(o) for o in options)
    raise _bad(name, value, f"is not one of {known}")


def check_range(value: float, name: str, *, minimum: float, maximum: float,
                describe: Callable[[float], str] = "{:g}".format,
                given: object = None) -> float:
    """An already-parsed quantity (bytes, bytes/s, s) within [minimum, maximum]; the message
    shows `given`, what the user wrote, when there is one."""
    if not minimum <= value <= maximum:
        written = show(value if given is None else given)
        raise ConfigError(f"{name}: {written} must be from {describe(minimum)} "
                          f"to {describe(maximum)}")
    return value


def decimal_rate(value: float) -> str:
    """1e6 -> '1 MB/s', 1e14 -> '100 TB/s' (bandwidths are decimal, as on data sheets)."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B/s"


def binary_size(value: float) -> str:
    """2**40 -> '1T' (sizes count powers of 1024, as nccl-tests does)."""
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g} bytes"


@dataclass(frozen=True, slots=True)
class Fields:
    """Typed, bounded reads of one table (a TOML table or a JSON object) named `where`."""

    table: Mapping[str, Any]
    where: str

    @staticmethod
    def of(value: object, where: str) -> Fields:
        """The table `value`, which must be one (`sim = 5` or `ops = []` are errors)."""
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {show(value)} must be a table of keys")
        return Fields(value, where)

    def name(self, key: str) -> str:
        return f"{self.where}.{key}"

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def known(self, keys: Sequence[str]) -> Fields:
        """Reject keys outside `keys`; return self, so a read can start with it."""
        check_keys(self.table, keys, self.where)
        return self

    def _read(self, key: str, default: T, check: Callable[[object, str], T]) -> T:
        if key not in self.table:
            return default
        return check(self.table[key], self.name(key))

    def integer(self, key: str, default: int, *, minimum: int, maximum: int) -> int:
        return self._read(key, default,
                          lambda v, n: check_int(v, n, minimum=minimum, maximum=maximum))

    def number(self, key: str, default: float, *, minimum: float, maximum: float,
               above: bool = False, unit: str = "") -> float:
        return self._read(key, default, lambda v, n: check_number(
            v, n, minimum=minimum, maximum=maximum, above=above, unit=unit))

    def fraction(self, key: str, default: float) -> float:
        return self._read(key, default, check_fraction)

    def efficiency(self, key: str, default: float) -> float:
        return self._read(key, default, check_efficiency)

    def link_efficiency(self, key: str, default: float) -> float:
        return self._read(key, default, check_link_efficiency)

    def line(self, key: str, default: str) -> str:
        return self._read(key, default, check_line)

    def boolean(self, key: str, default: bool) -> bool:
        return self._read(key, default, check_bool)

    def string(self, key: str, default: str) -> str:
        return self._read(key, default, check_string)

    def choice(self, key: str, default: T, options: Collection[T]) -> T:
        return self._read(key, default, lambda v, n: check_choice(v, n, options))

    def bandwidth(self, key: str, default: float) -> float:
        """'400Gb/s', '450GB/s' or bytes/s, from 1 MB/s to 100 TB/s."""
        return self._read(key, default, lambda v, n: check_range(
            parse_bandwidth(v, n), n, minimum=MIN_BANDWIDTH_BPS, maximum=MAX_BANDWIDTH_BPS,
            describe=decimal_rate, given=v))

    def time(self, key: str, default: float, *, maximum: float = MAX_LATENCY_S) -> float:
        """'2us', '1ms' or seconds, from 0 to `maximum` (1 s)."""
        return self._read(key, default, lambda v, n: check_range(
            parse_time(v, n), n, minimum=0.0, maximum=maximum, describe="{:g} s".format,
            given=v))

    def size(self, key: str, default: int, *, maximum: int = MAX_SIZE_BYTES) -> int:
        """'16M', '80G' or bytes, from 1 byte to `maximum`."""
        return self._read(key, default, lambda v, n: parse_size(v, n, maximum=maximum))

    def integers(self, key: str, default: tuple[int, ...], *, lengths: Collection[int],
                 minimum: int, maximum: int) -> tuple[int, ...]:
        """A list of `lengths` integers, each in [minimum, maximum]."""
        if key not in self.table:
            return default
        value = self.table[key]
        counts = " or ".join(map(str, sorted(lengths)))
        if not isinstance(value, list) or len(value) not in lengths or not all(map(is_int,
                                                                                    value)):
            raise _bad(self.name(key), value, f"must be a list of {counts} integers")
        if not all(minimum <= v <= maximum for v in value):
            raise _bad(self.name(key), value,
                       f"must hold integers from {minimum:,} to {maximum:,}")
        return tuple(value)

    def sub(self, key: str) -> Fields:
        """The sub-table `key` (empty when absent)."""
        return Fields.of(self.table.get(key, {}), self.name(key))
