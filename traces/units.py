"""Human units at the edges: sizes, bandwidths and times as people write them.

Inside parasim everything is SI (bytes, bytes/s, seconds). Sizes follow nccl-tests, where
K/M/G are powers of 1024; bandwidths follow network and GPU data sheets, where Gb/s and GB/s
are powers of 1000. Every parser returns a finite number or raises `ConfigError`: "1e400s",
`inf` and a 400-digit integer are errors, never an infinity that hangs or poisons a simulation.
"""

import math
import re

from traces.errors import ConfigError, show

MAX_SIZE_BYTES = 2**40
"""1 TiB: the default bound on a size (a message, a bucket); callers may pass their own."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_SIZE_POWER = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}

_BANDWIDTH = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([KMGT]?)(b|B)/s\s*$")
_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}

_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(ns|us|µs|ms|min|s|h|d)\s*$")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0,
            "min": 60.0, "h": 3600.0, "d": 86400.0}
"""A duration's units: a link's latency in ns or us, a checkpoint's write in s or min, a run's
mean time to interruption in h or d (`m` is not one: minutes or metres?)."""

_MAX_TEXT = 64  # characters: no honest quantity is longer, and int() of 5,000 digits raises


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: int | float, text: object, field: str) -> float:
    """`value` as a finite float, or a one-line error (inf, NaN, 10**400)."""
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{field}: {show(text)} is not a finite number")
    return number


def _match(pattern: re.Pattern[str], text: object, field: str, what: str) -> re.Match[str]:
    match = pattern.match(text) if isinstance(text, str) and len(text) <= _MAX_TEXT else None
    if not match:
        raise ConfigError(f"{field}: {show(text)} is not {what}")
    return match


def parse_size(text: object, field: str = "size", *, maximum: int = MAX_SIZE_BYTES) -> int:
    """'16M' -> 16777216 bytes (K/M/G/T are powers of 1024, as in nccl-tests), 1 to `maximum`."""
    if _is_number(text) and isinstance(text, int):
        value: float = text
    else:
        match = _match(_SIZE, text, field, "a size (write e.g. 1024, 64K, 16M, 8G)")
        value = _finite(float(match[1]), text, field) * 1024 ** _SIZE_POWER[match[2].upper()]
        if value != int(value):
            raise ConfigError(f"{field}: {show(text)} is not a whole number of bytes")
    if value <= 0:
        raise ConfigError(f"{field}: {show(text)} must be a positive number of bytes")
    if value > maximum:
        raise ConfigError(f"{field}: {show(text)} is too large (at most {maximum:,} bytes)")
    return int(value)


def parse_bandwidth(text: object, field: str = "bandwidth") -> float:
    """'400Gb/s' -> 5e10 bytes/s, '900GB/s' -> 9e11; a bare number is already bytes/s."""
    if _is_number(text):
        assert isinstance(text, int | float)
        value = _finite(text, text, field)
    else:
        match = _match(_BANDWIDTH, text, field,
                       "a bandwidth (write e.g. 400Gb/s or 450GB/s)")
        value = _finite(float(match[1]) * _DECIMAL[match[2].upper()], text, field)
        if match[3] == "b":
            value /= 8
    if not value > 0:
        raise ConfigError(f"{field}: {show(text)} must be a positive bandwidth")
    return value


def parse_time(text: object, field: str = "time") -> float:
    """'2us' -> 2e-6 s, '5min' -> 300 s, '24h', '2d'; a bare number is already seconds. Zero
    is allowed, negative is not."""
    if _is_number(text):
        assert isinstance(text, int | float)
        value = _finite(text, text, field)
    else:
        match = _match(_TIME, text, field, "a time (write e.g. 500ns, 2us, 1ms, 5min, 24h, 2d)")
        value = _finite(float(match[1]) * _SECONDS[match[2]], text, field)
    if not value >= 0:
        raise ConfigError(f"{field}: {show(text)} must not be negative")
    return value

_POWER = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(k?)W\s*$")


def parse_power(text: object, field: str = "power") -> float:
    """'500W', '500 W', '1.4kW' -> watts; a bare number is already watts. Positive, finite."""
    if _is_number(text):
        assert isinstance(text, int | float)
        value = _finite(text, text, field)
    else:
        match = _match(_POWER, text, field, "a power (write e.g. 500W or 1.4kW)")
        value = _finite(float(match[1]) * (1e3 if match[2] else 1.0), text, field)
    if not value > 0:
        raise ConfigError(f"{field}: {show(text)} must be a positive power")
    return value


MAX_STEP_SECONDS = 86_400.0
"""A day: the bound on a time in a trace (an op's start and end, seconds from the trace's
origin). No training step runs for a day; a later time is a corrupt or hostile file."""

MAX_OP_FLOPS = 1e22
"""The bound on one op's FLOPs: a day (`MAX_STEP_SECONDS`) at 1e17 FLOP/s, the fastest
accelerator a profile may describe (`traces.fields.MAX_TFLOPS`), is 8.6e21."""

MAX_OP_BYTES = 1e19
"""The bound on the bytes one op moves through memory: a day at 1e14 B/s, the fastest link or
memory a profile may describe (`traces.fields.MAX_BANDWIDTH_BPS`), is 8.6e18."""
