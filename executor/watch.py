"""What a local job shows while its ranks run: how many ranks have joined the process group,
then which step rank 0 is in and how many of its ops it has done, read by the launcher from the
ranks' shared record buffers every WATCH_S (issue 36: `parasim run` and `calibrate` printed
nothing for seconds to minutes).

    with watching(lambda unit, done, total: ...):    # unit 'rank', then 'item' (ops)
        run(experiment, out, steps=3)

The ranks write three header slots of their buffer: joined (1 once the process group is up),
the recorded step they are in (0 during warm-up), and their op count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from executor.recorder import HEADER, NOT_RECORDED

H_STEP, H_JOINED, H_OPS = 5, 6, 7
WATCH_S = 0.5
Counts = Callable[[str, int, int], None]

_watchers: list[tuple[Counts, int]] = []


@contextmanager
def watching(counts: Counts, steps: int = 1) -> Iterator[None]:
    """Local jobs started in the block report to `counts`; `steps` recorded steps each."""
    _watchers.append((counts, steps))
    try:
        yield
    finally:
        _watchers.pop()


def current() -> Callable[[dict[int, np.ndarray]], None] | None:
    """What the launcher calls with the records every WATCH_S; None when nobody watches."""
    if not _watchers:
        return None
    counts, steps = _watchers[-1]
    return lambda records: report(records, counts, steps)


def report(records: dict[int, np.ndarray], counts: Counts, steps: int) -> None:
    """Ranks joined of the world until all have; then rank 0's ops done over `steps` steps."""
    joined = sum(int(buf[H_JOINED]) for buf in records.values())
    counts("rank", joined, len(records))
    if joined < len(records):
        return
    buf = records[min(records)]
    ops, step = int(buf[H_OPS]), int(buf[H_STEP])
    if ops <= 0:
        return
    ends = buf[HEADER:HEADER + 2 * ops].reshape(-1, 2)[:, 1]
    done = int(np.count_nonzero(ends != NOT_RECORDED)) if step > 0 else 0
    counts("item", min(max(step - 1, 0) * ops + done, steps * ops), steps * ops)
