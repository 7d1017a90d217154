"""What the host gave the run, probed after the recorded steps: all-reduces over the whole
world at a few sizes, what one collective call costs here, then, from a few bytes (the
per-call cost) to megabytes (the per-byte cost); and the share of a core each rank gets
while every rank computes at once (`cpu_share`).

    probe = {"links": probe_links(device), "cpu_share": cpu_share()}   # on every rank
    table = probe_table(per_rank, world)    # the run's header entry, `meta.host_probe`

A run's own collectives are often of one size (a DP job's one gradient bucket), and one size
cannot tell the cost of a call from the cost of its bytes; `parasim whatif` fits link figures
to these samples beside the run's own (`sim.whatif.links`), as `parasim calibrate` fits them.
"""

from __future__ import annotations

import statistics
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


SHARE_SECONDS = 0.03
"""How long each rank computes in one `cpu_share` reading (several scheduler slices)."""


def cpu_share(repeats: int = PROBE_REPEATS) -> float:
    """The CPU time this rank's thread gets per second of wall time while every rank runs a
    matrix product loop at once (the median of `repeats` readings, each after a barrier):
    1 where each has a core to itself, cores / runnable threads where they time-share."""
    a = torch.ones(64, 64)
    readings = []
    for _ in range(repeats):
        dist.barrier()
        wall, cpu = time.perf_counter(), time.thread_time()
        while time.perf_counter() - wall < SHARE_SECONDS:
            a = torch.mm(a, a).clamp_(max=1.0)
        readings.append((time.thread_time() - cpu) / (time.perf_counter() - wall))
    return min(1.0, statistics.median(readings))


def probe_table(per_rank: Sequence[dict[str, Any]], world: int) -> dict[str, Any]:
    """The header entry: each call's time as its fastest rank saw it (the last to leave the
    barrier waits for no one: its time is the call's own), and the ranks' mean CPU share."""
    links = [rank["links"] for rank in per_rank]
    samples = [[int(calls[0][0]), min(float(c[1]) for c in calls)] for calls in zip(*links)]
    share = statistics.fmean(float(rank["cpu_share"]) for rank in per_rank)
    return {"collective": "all_reduce", "dtype": "fp32", "ranks": world, "samples": samples,
            "cpu_share": share}
