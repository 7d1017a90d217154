"""Whether parsing a JSON trace fits in this machine's memory, asked before `json.loads`:
a 6 MB .json.gz of 9.9 M minimal ops (inside every size and count bound) grew to 5.7 GB in
the parser and died with a MemoryError (issue 36's sweep). The estimate is a lower bound, so
a refusal is never wrong: the text decoded (one byte a character, twice: bytes and str) plus
the smallest parsed object an item becomes (`MIN_PARSED_BYTES`)."""

from __future__ import annotations

from traces.errors import ConfigError

MIN_PARSED_BYTES = 300
"""Python's json.loads of {"kind": "compute", "stream": "compute"}, the smallest op a trace
holds, measured with tracemalloc on CPython 3.12: 304 bytes (a dict and its two strings; the
small int and key strings are shared). A profiler event holds more fields, so more bytes."""
MEMINFO = "/proc/meminfo"


def available_bytes() -> int | None:
    """The memory the kernel says is available to start new work (MemAvailable); None where
    it cannot tell (not Linux)."""
    try:
        with open(MEMINFO, encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_parse_memory(text_bytes: int, items: int, source: str, what: str = "ops") -> None:
    """Refuse to parse `text_bytes` of JSON holding `items` objects when even the lower bound
    of what parsing needs is more than the memory available."""
    need = 2 * text_bytes + items * MIN_PARSED_BYTES
    free = available_bytes()
    if free is not None and need > free:
        raise ConfigError(f"{source}: parsing its {items:,} {what} needs at least "
                          f"{need / 1e9:,.1f} GB of memory, more than the {free / 1e9:,.1f} GB "
                          "this machine has available (replay a shorter step, or fewer ranks)")
