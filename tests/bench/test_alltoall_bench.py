"""What bench_alltoall compares against the published runs, as closed forms.

On one NVLink domain each rank sends S(n-1)/n over its own NVLink and receives as much, so
`parasim collective --op all_to_all` takes S(n-1)/n over the GPU's NVLink data rate plus one
fixed cost: NCCL's p2p latency (H100, and Blackwell on an NVL72 rack, one MNNVL node:
`p2p/Simple`). The data rate of
NVLink 5 is NCCL's own (18 links x SM100_NVLINK_BW 40.1 GB/s, src/graph/topo.h), written here
from that constant, not from the preset. Hence busbw (algbw x (n-1)/n) tends to the data rate
whatever n is: the bench's figures are this formula, not a fitted number.
"""

from __future__ import annotations

import json

import pytest

from sim.collectives import Collectives
from sim.collectives.nccl_p2p import peer_plan
from sim.collectives.nccl_system import system_for
from sim.collectives.sweep import sweep_row
from tests.bench.bench_alltoall import DATA, group_of
from topology import build_cluster
from topology.presets import NVLINK_EFFICIENCY


@pytest.mark.parametrize("n", [4, 8, 64])
def test_blackwell_p2p_is_link_plus_nccl_latency(n: int) -> None:
    """A GB300 NVL72 group, one tray (one host) or many (MNNVL, one NCCL node): NCCL's sm100
    model runs the all-to-all."""
    cluster = build_cluster("gb300-nvl72", nodes=1)
    group, size = tuple(range(n)), 2**33
    row = sweep_row(cluster, Collectives(cluster), "all_to_all", group, size, "auto", None,
                    "flow")
    latency = peer_plan(system_for(cluster, group), size / n).latency_s
    closed = size * (n - 1) / n / (18 * 40.1e9) + latency
    assert row.algo == "p2p/Simple"
    assert row.time_s == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("n", [4, 8])
def test_hopper_p2p_is_link_plus_nccl_latency(n: int) -> None:
    cluster = build_cluster("dgx-h100", nodes=1)
    group, size = tuple(range(n)), 524288000
    row = sweep_row(cluster, Collectives(cluster), "all_to_all", group, size, "auto", None,
                    "flow")
    latency = peer_plan(system_for(cluster, group), size / n).latency_s
    closed = size * (n - 1) / n / (450e9 * NVLINK_EFFICIENCY) + latency
    assert row.algo == "p2p/Simple"
    assert row.time_s == pytest.approx(closed, rel=1e-12)


def test_data_file_rows_match_their_runs() -> None:
    """Every source names a preset whose ranks are as many as its run's, on distinct devices
    that exist, and gives in-place figures only for sizes it gives out-of-place."""
    data = json.loads(DATA.read_text())
    ranks = {"gb300-oci-1host": 4, "gb300-oci-2hosts": 8, "gb300-oci-16hosts": 64,
             "gb300-oci-32hosts-2racks": 128, "h100-nccl-2169-4gpu": 4}
    for source in data["sources"]:
        group = group_of(source["group"])
        cluster = build_cluster(source["preset"], nodes=source["nodes"])
        assert len(set(group)) == len(group) == ranks[source["id"]]
        assert max(group) < cluster.num_devices
        assert set(source.get("in_place_busbw_GBps", {})) <= set(source["busbw_GBps"])
