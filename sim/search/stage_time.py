"""A chunk's time for one micro-batch in the analytic tier (`sim.search.analytic`): its units'
compute and side streams, communication beside the kernels it slows, the busiest stream.

    chunk = stage(layers, layer_time, first_time)   # a chunk of n layers and the embedding
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitTime:
    """One unit's seconds for one micro-batch: on the compute stream (kernels and inline
    TP/SP collectives) and on the side streams (ZeRO-3 gathers and reduce-scatters), forward
    and backward; its kernels alone; and its `tail`, the side-stream work its backward leaves
    in the step's last micro-batch (`UnitOps.final`)."""

    compute_fwd: float
    side_fwd: float
    compute_bwd: float
    side_bwd: float
    kernels: float
    tail: float
    beside_fwd: float
    """`compute_fwd` with every kernel slowed by communication in flight beside it
    (`Interference.kernel_scale`: NCCL's SMs and HBM traffic on a GPU)."""
    beside_bwd: float


@dataclass(frozen=True, slots=True)
class ChunkPass:
    """A chunk's forward and backward for one micro-batch: each as long as its compute stream
    or, where the side streams take longer (ZeRO-3 on a slow network), as they; and the tail
    of its last unit where the compute stream hides the side streams."""

    fwd: float
    bwd: float
    kernels: float
    tail: float


def beside(alone: float, slowed: float, side: float) -> float:
    """A compute stream of `alone` seconds (`slowed` with every kernel slowed by
    communication) that `side` seconds of communication run beside: the kernels that start
    while it is in flight take their slowed time, the rest their own."""
    if slowed <= alone:
        return alone
    return alone + min(side, slowed) * (1.0 - alone / slowed)


def stage(n: int, layer: UnitTime, *ends: UnitTime) -> ChunkPass:
    """A chunk of n layers and the model's `ends` it holds: streams add up over its units
    (a unit's gather is prefetched during the previous unit's compute), the chunk lasts as
    long as its busiest stream. Its last unit in backward is the embedding where it holds
    one (listed first), else a layer."""
    units = [*ends, *([layer] * n)]
    compute_fwd = sum(u.compute_fwd for u in units)
    compute_bwd = sum(u.compute_bwd for u in units)
    side_fwd = sum(u.side_fwd for u in units)
    side_bwd = sum(u.side_bwd for u in units)
    fwd = beside(compute_fwd, sum(u.beside_fwd for u in units), side_fwd)
    bwd = beside(compute_bwd, sum(u.beside_bwd for u in units), side_bwd)
    last = ends[0] if ends and ends[0].tail else layer
    return ChunkPass(fwd=max(fwd, side_fwd), bwd=max(bwd, side_bwd),
                     kernels=sum(u.kernels for u in units),
                     tail=last.tail if bwd >= side_bwd else 0.0)
