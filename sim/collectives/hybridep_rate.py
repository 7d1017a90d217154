"""HybridEP's measured rate inside one NVLink domain: its dispatch and combine take at least the
time their own kernels need to move a rank's received bytes, whatever the links could carry.

HybridEP (`traces.hybridep`) moves tokens with TMA copies from a fixed grid of blocks
(`num_sms_dispatch_api` / `num_sms_combine_api`, Megatron-Core's moe_hybridep_num_sms, default
16: `traces.moe_overlap`), so inside an NVLink domain its rate is the kernels', not the
links'. DeepEP's Hybrid-EP README (deepseek-ai/DeepEP docs/README_Hybrid-EP.md @41cad94,
"Performance Results") measures it at DeepSeek-V3's shape (4,096 tokens a rank, hidden 7,168,
top-8, random uniform routing, 8 local experts), as "algorithm bandwidth": the bytes a rank
receives (every token it gets once, its own included: `nvl_recv_bytes` in the test's output,
e.g. deepseek-ai/DeepEP issue #590's 393.84 MB at 16 ranks, which is 65,536 tokens x
P(a rank is hit) x 7,168 x 2 bytes to 2%) over the call's time. Through the Torch API, the
call Megatron-Core makes, at 16 SMs (GB/s):

    B200, 8 ranks             dispatch (BF16) 535.94, combine 530.86
    GB200, 8/16/24/32/36      dispatch (BF16) 550.10 / 472.84 / 441.89 / 485.50 / 469.96,
                              combine 538.44 / 474.48 / 444.40 / 423.19 / 418.27

(kernels alone: B200 734.95 and 673.84). So an op whose EP group lies in one NVLink domain of
a measured accelerator at a measured group size takes at least `received / rate`: where the
flows alone (`sim.engine.flows.solo_time`) would be faster, the difference is added to their
latency (the kernels' own pace, which holds whatever else shares the links). B300 and GB300
take B200's and GB200's figures (`TAKEN_FROM`, an assumption). Not applied: other
accelerators (Hopper's table is of RDMA), other group sizes (GB200's EP 64), groups
spanning domains (the RDMA part is the flows'), DeepEP's own kernels. The figures are at
16 SMs, Megatron-Core's default, which the DeepSeek-V3 recipes keep; a recipe's own
moe_hybridep_num_sms is not looked at here. Dispatches are taken in BF16, as parasim's
dispatch rows are (hidden x 2 bytes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sim.collectives.base import Lowering
from sim.engine.flows import solo_time
from topology.cluster import Cluster
from traces.alltoallv import AllToAllv
from traces.deepep import DeepEp

RATES: dict[tuple[str, int], tuple[float, float]] = {
    ("B200-SXM-180GB", 8): (535.94e9, 530.86e9),
    ("GB200-186GB", 8): (550.10e9, 538.44e9),
    ("GB200-186GB", 16): (472.84e9, 474.48e9),
    ("GB200-186GB", 24): (441.89e9, 444.40e9),
    ("GB200-186GB", 32): (485.50e9, 423.19e9),
    ("GB200-186GB", 36): (469.96e9, 418.27e9),
}
"""(accelerator, EP ranks) -> (dispatch, combine) algorithm bandwidth, bytes/s, HybridEP's Torch
API at 16 SMs (module docstring)."""

TAKEN_FROM = {"B300-SXM-288GB": "B200-SXM-180GB", "GB300-288GB": "GB200-186GB"}
"""Blackwell Ultra takes Blackwell's figures, an assumption, not a measurement: no Hybrid-EP
figure for B300 or GB300 inside one NVLink domain is published (deepseek-ai/DeepEP issue #590's
B300 run spans two nodes over RDMA); both keep NVLink 5 and the same NVLink domains as B200 and
GB200 (`topology.presets`: dgx-b300 is DGX B200's server, GB300 NVL72 GB200 NVL72's, 1.8 TB/s
NVLink per GPU both ways), and HybridEP's 16
blocks are TMA copies, which Blackwell Ultra does not change (`topology.presets` cites what it
does: its SFUs and NVFP4)."""


def received_bytes(d: DeepEp, ep: int) -> float:
    """The most bytes one member receives: every rank's distinct tokens for its experts, its
    own included, `d.row` bytes each (all ranks route alike: `traces.deepep`)."""
    return max(ep * d.tokens_to([j], ep) * d.row for j in range(ep))


def measured_rate(cluster: Cluster, group: Sequence[int], split: AllToAllv) -> float | None:
    """HybridEP's measured rate for this op (dispatch, or combine for a `by_sender` split),
    or None where none applies (module docstring)."""
    d = split.deepep
    if d is None or d.dispatch != "hybridep":
        return None
    if len({cluster.server_of(r) for r in group}) != 1:
        return None
    name = cluster.accelerator.name
    rates = RATES.get((TAKEN_FROM.get(name, name), len(group)))
    if rates is None:
        return None
    return rates[1] if split.by_sender else rates[0]


def sm_floor(cluster: Cluster, group: Sequence[int], split: AllToAllv) -> float:
    """Seconds HybridEP's kernels take at least for this op (0 where unmeasured)."""
    rate = measured_rate(cluster, group, split)
    if rate is None:
        return 0.0
    assert split.deepep is not None
    return received_bytes(split.deepep, len(group)) / rate


def with_sm_floor(lowering: Lowering, cluster: Cluster, group: Sequence[int],
                  split: AllToAllv) -> Lowering:
    """`lowering` with the kernels' floor: where its flows alone finish before
    `sm_floor`, every flow set waits the difference longer (one round: `lower_deepep`)."""
    floor = sm_floor(cluster, group, split)
    alone = solo_time(lowering, split.mean_send_bytes, cluster.link_capacity)
    extra = floor - alone
    if extra <= 0:
        return lowering
    return tuple(tuple((dataclasses.replace(flows, latency_s=flows.latency_s + extra), factor)
                       for flows, factor in rnd) for rnd in lowering)
