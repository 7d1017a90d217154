"""Human units at the edges: sizes, bandwidths and times as people write them.

Inside parasim everything is SI (bytes, bytes/s, seconds). Sizes follow nccl-tests, where
K/M/G are powers of 1024; bandwidths follow network and GPU data sheets, where Gb/s and GB/s
are powers of 1000.
"""

import re

from traces.errors import ConfigError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_SIZE_POWER = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}

_BANDWIDTH = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([KMGT]?)(b|B)/s\s*$")
_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}

_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(ns|us|µs|ms|s)\s*$")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_size(text: str | int, field: str = "size") -> int:
    """'16M' -> 16777216 bytes (K/M/G/T are powers of 1024, as in nccl-tests)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise ConfigError(f"{field}: {text!r} is not a size (write e.g. 1024, 64K, 16M, 8G)")
        value = float(match[1]) * 1024 ** _SIZE_POWER[match[2].upper()]
        if value != int(value):
            raise ConfigError(f"{field}: {text!r} is not a whole number of bytes")
        value = int(value)
    if value <= 0:
        raise ConfigError(f"{field}: {text!r} must be a positive number of bytes")
    return value


def parse_bandwidth(text: str | float, field: str = "bandwidth") -> float:
    """'400Gb/s' -> 5e10 bytes/s, '900GB/s' -> 9e11; a bare number is already bytes/s."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _BANDWIDTH.match(str(text))
        if not match:
            raise ConfigError(f"{field}: {text!r} is not a bandwidth "
                              "(write e.g. 400Gb/s or 450GB/s)")
        value = float(match[1]) * _DECIMAL[match[2].upper()]
        if match[3] == "b":
            value /= 8
    if not value > 0:
        raise ConfigError(f"{field}: {text!r} must be a positive bandwidth")
    return value


def parse_time(text: str | float, field: str = "time") -> float:
    """'2us' -> 2e-6 s; a bare number is already seconds. Zero is allowed, negative is not."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _TIME.match(str(text))
        if not match:
            raise ConfigError(f"{field}: {text!r} is not a time (write e.g. 500ns, 2us, 1ms)")
        value = float(match[1]) * _SECONDS[match[2]]
    if not value >= 0:
        raise ConfigError(f"{field}: {text!r} must not be negative")
    return value
