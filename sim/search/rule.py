"""The seeds' rule of thumb for laying a model on GPUs, as a layout the search can rank.

From the CS336 notes (`shared/seeds/000_33e129ad6013961a.txt`, "Rule of Thumb"):

  1. fit the model in memory: tensor parallelism fills a node first (TP = 8 over NVLink), then
     pipeline parallelism or FSDP (ZeRO-3) across nodes until the model fits;
  2. data parallelism with the GPUs that are left;
  3. gradient accumulation when the batch per replica is small.

The seeds also rank the axes by the bandwidth they need (`shared/seeds/`, 3D parallelism:
TP (NVLink) → CP (NVLink) → PP (IB) → DP), so context parallelism comes right after TP: a long
sequence's activations do not shrink with pipeline depth (the first stage holds a
micro-batch per stage in flight), only with TP, CP or recomputation.

As a procedure: TP = the largest power of two up to a node's GPUs; CP = the smallest of the
space's cp values (1 first) with which some layout fits; then, with plain data
parallelism, the smallest pipeline depth whose layout is valid and fits; failing that, ZeRO-3
with the smallest depth that fits; DP = the rest; micro-batches of one sample, so the replica's
batch is accumulated over as many micro-batches as it holds. The rule says nothing of SP,
recomputation or interleaving: they stay off (1F1B, no recomputation). Keys the config fixes in
[parallel] are kept. Validity and memory are the project's own (`check_layout`,
`sim.models.memory` through the analytic model).
"""

from __future__ import annotations

from sim.search.problem import Context
from sim.search.space import validate
from traces.errors import ConfigError
from traces.layout import Layout

PLAIN = {"micro_batch": 1, "vp": 1, "sp": False, "recompute": "none", "schedule": "1f1b"}


def rule_of_thumb(ctx: Context) -> tuple[Layout, bool] | None:
    """The rule's layout and whether it fits; None when the rule yields no valid layout at
    all. The first layout that fits, else the first valid one."""
    model, cluster, fixed = ctx.base.model, ctx.base.cluster, ctx.space.fixed
    per_node = cluster.devices_per_server
    tps = [fixed["tp"]] if "tp" in fixed else [2**k for k in range(per_node.bit_length())
                                                if 2**k <= per_node][::-1]
    pps = [fixed["pp"]] if "pp" in fixed else [d for d in range(1, model.layers + 1)
                                                if model.layers % d == 0]
    zeros = [fixed["zero"]] if "zero" in fixed else [0, 3]
    cps = [fixed["cp"]] if "cp" in fixed else sorted(ctx.space.values.get("cp", (1,)))
    first_valid = None
    for tp in tps:
        for cp in cps:
            for zero in zeros:
                for pp in pps:
                    found = _try(ctx, {**PLAIN, **fixed, "tp": tp, "cp": cp, "pp": pp,
                                       "zero": zero})
                    if found is not None and found[1]:
                        return found
                    if found is not None:
                        first_valid = first_valid or found[0]
    return (first_valid, False) if first_valid is not None else None


def _try(ctx: Context, table: dict[str, object]) -> tuple[Layout, bool] | None:
    """The layout of `table` (dp: what is left of the GPUs) and whether it fits; None if it
    is not valid."""
    model, cluster, fixed = ctx.base.model, ctx.base.cluster, ctx.space.fixed
    tp, cp, pp = table["tp"], table["cp"], table["pp"]
    if "dp" not in fixed and isinstance(tp, int) and isinstance(cp, int) and \
            isinstance(pp, int):
        table["dp"] = max(1, cluster.num_devices // (tp * cp * pp))
    try:
        layout = validate(table, model, world=cluster.num_devices,
                          devices_per_server=cluster.devices_per_server)
    except ConfigError:
        return None
    fits = max(m.total_bytes for m in ctx.analytic.memory(layout)) \
        <= cluster.accelerator.memory_bytes
    return layout, fits
