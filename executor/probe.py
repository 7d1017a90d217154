"""A short sweep of all-reduces over the whole world at a few sizes, run after the recorded
steps: what one collective call costs on this host, then, from a few bytes (the per-call
cost) to megabytes (the per-byte cost).

    samples = probe_links(device)           # on every rank: [(bytes, seconds), ...]
    table = probe_table(per_rank, world)    # the run's header entry, `meta.link_probe`

A run's own collectives are often of one size (a DP job's one gradient bucket), and one size
cannot tell the cost of a call from the cost of its bytes; `parasim whatif` fits link figures
to these samples beside the run's own (`sim.whatif.links`), as `parasim calibrate` fits them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

PROBE_BYTES = (4, 64 * 2**10, 2**20, 4 * 2**20)
"""From one fp32 number (a loss, a norm) through a TP activation to a gradient bucket."""
PROBE_REPEATS = 3


def probe_links(device: torch.device) -> list[tuple[int, float]]:
    """This rank's time of each probe all-reduce (fp32, sum, the world group), each call
    started right after a barrier, after one untimed call of its size."""
    out = []
    for size in PROBE_BYTES:
        buffer = torch.zeros(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buffer)
        for _ in range(PROBE_REPEATS):
            dist.barrier()
            began = time.perf_counter_ns()
            dist.all_reduce(buffer)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            out.append((size, (time.perf_counter_ns() - began) / 1e9))
    return out


def probe_table(per_rank: Sequence[Sequence[Sequence[float]]], world: int) -> dict[str, Any]:
    """The header entry: each call's time as its fastest rank saw it (the last to leave the
    barrier waits for no one: its time is the call's own)."""
    samples = [[int(calls[0][0]), min(float(c[1]) for c in calls)] for calls in zip(*per_rank)]
    return {"collective": "all_reduce", "dtype": "fp32", "ranks": world, "samples": samples}
