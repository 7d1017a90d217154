"""What the host gave the run, probed after the recorded steps: all-reduces over the whole
world at a few sizes, each after a burst of compute as a TP step issues them, what one
collective call costs here, then, from a few bytes (the per-call cost) to megabytes (the
per-byte cost); and the share of a core each rank gets
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
"""`cpu_share`'s readings."""
PROBE_CALLS = 32
"""Timed all-reduces per size. On a host whose cores are time-shared a call either costs
its own few hundred µs or, where a gloo thread it wakes finds both cores busy, waits for the
next scheduler tick (4 ms at this host's CONFIG_HZ=250, `/proc/config.gz`): bimodal, in
probes of 100-200 calls here (7 Dec 2026) 3-90% of them slow, by what ran before the call
(docs/whatif.md, "Where a TP 2 step's time goes"). A TP step's sum is its count
times the mean, and three calls cannot tell a mean of 0.3 ms from one of 1.5 ms."""
BURST_SECONDS = 1e-3
"""The compute before each timed call, as a TP rank computes between its all-reduces (the
tiny GPT's TP 2 step here: ~86 ms of kernels over 81 all-reduces, ~1 ms apart). Right after a
barrier the same 64 KiB call averaged 0.44 ms over 200 calls, after 1 ms of compute 0.83-1.6
ms, as in the TP 2 step itself (1.06-1.33 ms after its last rank arrived, 5 of 6 captures)."""


def probe_links(device: torch.device) -> list[tuple[int, float]]:
    """This rank's time of each probe all-reduce (fp32, sum, the world group): per size,
    one untimed call and a barrier, then `PROBE_CALLS` calls, each after `BURST_SECONDS` of
    compute (`burst`), as a TP step issues them between its kernels."""
    out = []
    work = torch.ones(64, 64)
    for size in PROBE_BYTES:
        buffer = torch.zeros(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buffer)
        dist.barrier()
        for _ in range(PROBE_CALLS):
            work = burst(work, BURST_SECONDS)
            began = time.perf_counter_ns()
            dist.all_reduce(buffer)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            out.append((size, (time.perf_counter_ns() - began) / 1e9))
    return out


def burst(work: torch.Tensor, seconds: float) -> torch.Tensor:
    """Matrix products on `work` for `seconds` of wall time (at least one)."""
    began = time.perf_counter()
    work = torch.mm(work, work).clamp_(max=1.0)
    while time.perf_counter() - began < seconds:
        work = torch.mm(work, work).clamp_(max=1.0)
    return work


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
        a = burst(a, SHARE_SECONDS)
        readings.append((time.thread_time() - cpu) / (time.perf_counter() - wall))
    return min(1.0, statistics.median(readings))


def probe_table(per_rank: Sequence[dict[str, Any]], world: int) -> dict[str, Any]:
    """The header entry: each call's time as its fastest rank saw it (the last to arrive
    waits for no one: its time is the call's own, the others' wait for it apart), and the
    ranks' mean CPU share."""
    links = [rank["links"] for rank in per_rank]
    samples = [[int(calls[0][0]), min(float(c[1]) for c in calls)] for calls in zip(*links)]
    share = statistics.fmean(float(rank["cpu_share"]) for rank in per_rank)
    return {"collective": "all_reduce", "dtype": "fp32", "ranks": world, "samples": samples,
            "cpu_share": share}
