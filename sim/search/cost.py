"""What simulating a layout in full costs, relative to other layouts: the order `parasim
search` sends its simulations in (the longest first, so two workers finish together).

To first order a replay costs per op it runs: every micro-batch through every layer, one
layer's ops as the plan builder makes them (the analytic model's reduced plan), and the
gradient buckets' reductions (in every micro-batch under ZeRO-2). A collective whose group
leaves its server costs far more than a kernel or an NVLink collective: its flows cross the
fabric, where the flow model shares links among everything in flight (and folded copies add
theirs), so it counts `CROSSING` per member besides. Measured on the shipped GPT-3 search
(1024 A100s, 17 simulations): ~6.5 µs of CPU per op, 2-5 times that per member of a
crossing collective; ZeRO-2/3 layouts took 2-11 s, ZeRO-1 ones of more ops about 1 s, which
ordering by ops alone sent first.
"""

from __future__ import annotations

from sim.search.analytic import Analytic
from traces.layout import Layout

CROSSING = 4.0
"""A crossing collective's weight per member, in ops."""


def simulation_cost(analytic: Analytic, layout: Layout) -> float:
    """The relative cost of simulating `layout` (see the module docstring)."""
    servers = analytic.cluster.devices_per_server

    def crossing(axis: str) -> float:
        group = analytic.group(layout, axis)
        return CROSSING * len(group) if len({r // servers for r in group}) > 1 else 0.0

    ops = analytic.pass_ops(layout)
    layer = ops.layer
    per_layer = sum(1.0 + (crossing(axis) if axis else 0.0) for _, axis in
                    layer.compute_fwd + layer.compute_bwd + layer.side_fwd + layer.side_bwd)
    cost = layout.num_microbatches * analytic.model.layers * per_layer
    if ops.grad_reduction is not None:
        first, middle, last = (len(analytic.buckets(layout, r))
                               for r in (0, min(1, layout.pp - 1), layout.pp - 1))
        buckets = first + (last if layout.pp > 1 else 0) + max(layout.pp - 2, 0) * middle
        times = (layout.num_microbatches if ops.reduce_every_microbatch else 1) * \
            (1 + ops.gather_after_optimizer)
        cost += buckets * times * (1.0 + crossing("dp"))
    return cost
