"""Pause Python's cyclic garbage collector while building hundreds of thousands of objects.

Every 700 allocations the collector rescans young objects, and now and then all of them; a
1024-GPU plan holds ~10^6 ops and nodes that form no cycles, so that work is pure overhead
(half the plan builder's time, a third of loading a 250k-op trace). Reference counting still
frees everything as usual.
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
            gc.enable()
