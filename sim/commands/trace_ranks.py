"""`--trace-ranks 0,8-15`: the ranks a timed trace keeps in `--trace` and `--chrome` outputs (a
1024-GPU step unfolded is hundreds of MB; a few ranks are what one opens in Perfetto).

A folded step simulates one rank per class of identical ranks (`traces.identity`), so a rank
asked for that the step did not simulate on its own is named in one warning line (`--no-fold`
simulates every rank); a selection that keeps no rank at all is refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from traces.errors import ConfigError, show, warn
from traces.ops import Trace

MAX_PARTS = 1024
"""The most comma-separated parts one --trace-ranks takes."""


def add_trace_ranks_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace-ranks", metavar="R,A-B", help="keep only these ranks in "
                        "--trace and --chrome (e.g. 0,8-15)")


def parse_ranks(text: str, world: int) -> tuple[int, ...]:
    """'0,8-15' -> (0, 8, 9, ..., 15), each rank below `world`, checked before expanding."""
    flag = f"--trace-ranks: {show(text)}"
    parts = text.split(",")
    if len(parts) > MAX_PARTS:
        raise ConfigError(f"{flag} has more than {MAX_PARTS:,} parts")
    ranks: set[int] = set()
    for part in parts:
        lo_text, dash, hi_text = part.strip().partition("-")
        try:
            lo, hi = int(lo_text), int(hi_text if dash else lo_text)
        except ValueError:
            raise ConfigError(f"{flag} is not a list of ranks and ranges (write e.g. "
                              "0,8-15)") from None
        if not 0 <= lo <= hi < world:
            raise ConfigError(f"{flag}: {show(part.strip())} must be ranks from 0 to "
                              f"{world - 1}, a range low to high")
        ranks.update(range(lo, hi + 1))
    return tuple(sorted(ranks))


def keep_ranks(trace: Trace, ranks: Sequence[int] | None) -> Trace:
    """`trace` with only `ranks` (and their memory curves); None keeps every rank."""
    if ranks is None:
        return trace
    kept = [r for r in ranks if r in trace.ops]
    missing = [r for r in ranks if r not in trace.ops]
    if not kept:
        raise ConfigError(f"--trace-ranks: none of {spans(ranks)} is simulated on its own in "
                          f"this folded step (it simulates {spans(trace.ranks)}; --no-fold "
                          "simulates every rank)")
    if missing:
        warn(f"--trace-ranks: {spans(missing)} not simulated on their own in this folded step, "
             f"left out (--no-fold simulates every rank)")
    memory = trace.meta.memory
    meta = replace(trace.meta, memory={r: memory[r] for r in kept if r in memory}) \
        if memory is not None else trace.meta
    return Trace({r: trace.ops[r] for r in kept}, meta)


def spans(ranks: Sequence[int]) -> str:
    """[0, 8, 9, 10] -> '0,8-10'."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].rpartition("-")[2] == str(r - 1):
            out[-1] = f"{out[-1].partition('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)
