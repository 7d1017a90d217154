"""A built cluster with measured figures in place of its preset's: links of a kind, and the
accelerator's roofs.

    cluster = with_links(cluster, {"loopback": (1.6e9, 2.1e-5)})    # (bytes/s, seconds)
    cluster = with_links(cluster, {}, calls={"loopback": 3e-4})      # per collective call
    cluster = with_accelerator(cluster, peak_flops=7.1e10, hbm_bandwidth_Bps=9e9)

What `parasim calibrate` measures replaces what a preset guessed: every directed link whose
`kind` is named gets the measured bandwidth (what data flows can use, so no further efficiency
is applied) and latency; kinds the cluster does not have are left alone (a profile measured on
a server with NVLink and InfiniBand applies to one node without InfiniBand). `calls` gives a
class's per-call software cost of a collective (graph attribute `call_s`, by kind: what a
library pays once per call, before any message moves; `call_cost` reads it). The graph is
copied, never mutated: a `Cluster` is a value. Bad figures are the caller's to refuse
(`sim.profile` reads them through `traces.fields`); here they are invariants.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from topology.cluster import Cluster

LinkFigures = tuple[float, float]
"""(bandwidth in bytes/s per direction, latency in seconds) of one link."""


def with_links(cluster: Cluster, figures: Mapping[str, LinkFigures],
               calls: Mapping[str, float] | None = None) -> Cluster:
    """`cluster` with every link of each named kind carrying the given figures, and the
    kinds in `calls` costing that much per collective call."""
    present = {kind: value for kind, value in figures.items() if kind in cluster.link_kind}
    costs = {kind: s for kind, s in (calls or {}).items() if kind in cluster.link_kind}
    if not present and not costs:
        return cluster
    for kind, (bandwidth, latency) in present.items():
        assert math.isfinite(bandwidth) and bandwidth > 0, f"{kind}: bandwidth {bandwidth}"
        assert math.isfinite(latency) and latency >= 0, f"{kind}: latency {latency}"
    assert all(math.isfinite(s) and s >= 0 for s in costs.values()), f"call costs {costs}"
    graph = cluster.graph.copy()
    graph.graph["call_s"] = {**call_costs(cluster), **costs}
    for _, _, data in graph.edges(data=True):
        found = present.get(data["kind"])
        if found is not None:
            data["bandwidth"], data["latency"] = found
    return Cluster(name=cluster.name, source=graph, devices=cluster.devices,
                   accelerator=cluster.accelerator,
                   devices_per_server=cluster.devices_per_server, fabric=cluster.fabric,
                   table=cluster.table)


def with_accelerator(cluster: Cluster, *, peak_flops: float | None = None,
                     hbm_bandwidth_Bps: float | None = None) -> Cluster:
    """`cluster` whose accelerator has the given roofs; the graph is shared (it does not
    change)."""
    accelerator = cluster.accelerator
    if peak_flops is not None:
        assert math.isfinite(peak_flops) and peak_flops > 0, f"peak {peak_flops}"
        # a measured roof is the rate the chip ran at while measured: no clock scaling
        accelerator = dataclasses.replace(accelerator, peak_flops=peak_flops,
                                          peak_clock_MHz=0.0, sustained_clock_MHz=0.0)
    if hbm_bandwidth_Bps is not None:
        assert math.isfinite(hbm_bandwidth_Bps) and hbm_bandwidth_Bps > 0
        accelerator = dataclasses.replace(accelerator, hbm_bandwidth_Bps=hbm_bandwidth_Bps)
    if accelerator is cluster.accelerator:
        return cluster
    return Cluster(name=cluster.name, source=cluster.source, devices=cluster.devices,
                   accelerator=accelerator, devices_per_server=cluster.devices_per_server,
                   fabric=cluster.fabric, table=cluster.table)


def call_costs(cluster: Cluster) -> dict[str, float]:
    """The per-call cost of collectives by link kind (none: 0)."""
    return dict(cluster.graph.graph.get("call_s", {}))


def call_cost(cluster: Cluster, links: Iterable[int]) -> float:
    """What one collective call over these links costs before any message moves: the
    largest per-call cost of their classes."""
    costs = call_costs(cluster)
    return max((costs.get(cluster.link_kind[link], 0.0) for link in links), default=0.0)


def link_figures(cluster: Cluster) -> dict[str, LinkFigures]:
    """Each link kind's figures, where all links of the kind agree (the usual case: a preset
    gives one bandwidth and latency per class); kinds with mixed figures are left out."""
    seen: dict[str, set[LinkFigures]] = {}
    for kind, bandwidth, latency in zip(cluster.link_kind, cluster.link_capacity,
                                        cluster.link_latency):
        seen.setdefault(kind, set()).add((bandwidth, latency))
    return {kind: next(iter(values)) for kind, values in sorted(seen.items())
            if len(values) == 1}
