"""Pause Python's cyclic garbage collector while building hundreds of thousands of objects.

Every 700 allocations the collector rescans young objects, and now and then all of them; a
1024-GPU plan holds ~10^6 ops and nodes that form no cycles, so that work is pure overhead
(half the plan builder's time, a third of loading a 250k-op trace). Reference counting still
frees everything as usual.

At the end the objects made meanwhile are moved to the oldest generation unscanned (frozen,
then unfrozen at once): left young, the first collection after the pause scanned every one
of them (0.25 s after a 1024-GPU plan). Nothing stays frozen, so cyclic garbage among them is
still found, by the next full collection. Where someone else holds objects frozen (a server
that forks), their freeze is left alone and the collector simply resumes.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:  # ours to freeze and unfreeze
                gc.freeze()
                gc.unfreeze()
            gc.enable()
